"""KV caches with rollback:

* :mod:`.slots` - crop rollback of a contiguous (or paged) cache, and :class:`SlotCache`, the engine's per-row
  slot bookkeeping (left-padded rows, holes, tree compaction);
* :mod:`.paged` - the paged cache: a block allocator with a free list and a ``transformers.Cache`` on top of it.
"""

from .paged import BlockTable, PagedKVCache, check_pool_fits
from .slots import SlotCache, crop

__all__ = ["crop", "SlotCache", "BlockTable", "PagedKVCache", "check_pool_fits"]
