"""A cheaper verify on CPU: every ``nn.Linear`` through oneDNN with pre-packed weights.

Why: decoding one token multiplies each weight matrix by ONE row (a GEMV, which MKL does at
memory speed), while verifying K drafted tokens multiplies by K+1 rows (a small-M GEMM).  On the
2-core CPUs this course was written on, MKL's small-M GEMM for SmolLM2's 576 x 49152 output layer
took about 21 ms for 2 rows against 8.7 ms for 1, so one verify forward cost about twice a decode
step and speculative decoding could barely win.  oneDNN with the weight reordered ONCE into its
blocked layout ("pre-packed") costs about the same for 1..8 rows: the verify curve T(n)/T(1)
flattens, which is what speculative decoding needs (see ``profiling.measure_verify_curve``).

``prepack_linears(model)`` swaps every ``nn.Linear`` for a ``PackedLinear`` (in place).  The
original ``weight``/``bias`` parameters stay on the module (so tied embeddings stay tied, the
state dict is unchanged and ``unpack_linears`` is free); the packed copy is a private cache,
rebuilt if the weight is modified in place or replaced.  The packed path is used only for fp32
CPU inputs without autograd; everything else (CUDA, float64, bf16, training) goes through
``F.linear``.  The oneDNN ops are private PyTorch API: they are wrapped in ONE place below
(``_pack`` / ``_packed_linear``) and probed once per process with a test call checked against
``F.linear``; when the probe fails, ``prepack_linears`` leaves the model untouched.

Pre-packing is not faster everywhere: on some CPUs (seen on Intel Xeons with AVX-512/AMX) the plain
one-row GEMV beats the packed path while packed wins from two rows on.  Each ``PackedLinear`` therefore
has a dispatch threshold ``plain_rows_max``: inputs with at most that many rows (batch x new tokens) go
through ``F.linear`` with the original weight, larger ones through oneDNN.  ``profiling.tune_dispatch(model)``
measures both paths per forward width on this machine and sets the threshold so that every width uses
the faster one (``set_plain_rows`` sets it by hand); the default 0 means "always packed".

Outputs are not bit-identical to ``F.linear`` (another summation order): the logits of SmolLM2
differ by about 1e-4 (fp32 rounding), and tests check < 1e-3 and identical argmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "PackedLinear", "packed_linear_available", "prepack_linears", "unpack_linears", "count_packed", "set_plain_rows",
    "plain_rows",
]

_AVAILABLE: bool | None = None  # probed once per process (see packed_linear_available)


# --- the only two places that touch private oneDNN ops -----------------------------------------
def _pack(weight: torch.Tensor) -> torch.Tensor:
    """Reorder an fp32 [out, in] weight into oneDNN's blocked layout (an opaque mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] @ packed.T + bias -> [..., out], through oneDNN."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


# ------------------------------------------------------------------------------------------------
def packed_linear_available() -> bool:
    """True if this PyTorch build runs the pre-packed oneDNN linear and it agrees with F.linear.

    Probed once per process: a small fp32 linear (with and without bias, 1 and 5 rows, 3-D input)
    must run and match ``F.linear`` within 1e-4."""
    global _AVAILABLE
    if _AVAILABLE is None:
        _AVAILABLE = _probe()
    return _AVAILABLE


def _probe() -> bool:
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        g = torch.Generator().manual_seed(0)
        w = torch.randn(24, 40, generator=g)  # [out, in]
        b = torch.randn(24, generator=g)  # [out]
        packed = _pack(w)
        with torch.no_grad():
            for x in (torch.randn(1, 40, generator=g), torch.randn(5, 40, generator=g), torch.randn(2, 3, 40, generator=g)):
                for bias in (None, b):
                    got = _packed_linear(x, packed, bias)  # [..., 24]
                    want = F.linear(x, w, bias)  # [..., 24]
                    if got.shape != want.shape or got.dtype != want.dtype or not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
                        return False
        return True
    except Exception:  # any failure of a private op means: not available, use F.linear
        return False


def _weight_key(w: torch.Tensor) -> tuple:
    """Changes when the weight does: an in-place update bumps ``_version``; ``.to()`` or reassignment
    moves ``data_ptr``.  Inference tensors (made under ``torch.inference_mode``) cannot be modified
    in place outside it and have no version counter: their key is the pointer alone."""
    try:
        return (w._version, w.data_ptr())
    except RuntimeError:
        return (None, w.data_ptr())


class PackedLinear(nn.Module):
    """Drop-in for ``nn.Linear`` whose fp32 CPU inference runs oneDNN with a pre-packed weight.

    It keeps the original ``weight`` and ``bias`` Parameters (shared with any tied module), so
    ``state_dict``, ``.to()``, weight tying and ``unpack_linears`` behave as before."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight  # the same Parameter object: tied weights stay tied
        self.bias = linear.bias
        self._packed: torch.Tensor | None = None  # a plain attribute: .to()/state_dict never see it
        self._packed_key: tuple | None = None
        self.plain_rows_max = 0  # inputs with at most this many rows use F.linear (see tune_dispatch)

    def _key(self) -> tuple:
        return _weight_key(self.weight)

    def packed_weight(self) -> torch.Tensor:
        """The packed copy of ``weight``, (re)built when the weight changed since the last pack."""
        key = self._key()
        if self._packed is None or self._packed_key != key:
            self._packed = _pack(self.weight)
            self._packed_key = key
        return self._packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weight, self.bias
        if (
            x.dtype is not torch.float32 or w.dtype is not torch.float32 or x.device.type != "cpu" or w.device.type != "cpu"
            or (b is not None and (b.dtype is not torch.float32 or b.device.type != "cpu"))
            or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)))
        ):  # not fp32 CPU inference (the oneDNN op has no autograd formula): plain F.linear
            return F.linear(x, w, b)
        if self.plain_rows_max and x.numel() // self.in_features <= self.plain_rows_max:
            return F.linear(x, w, b)  # few rows: the plain GEMV is faster on this machine
        packed = self._packed
        if packed is None or self._packed_key != _weight_key(w):
            packed = self.packed_weight()
        return _packed_linear(x, packed, None if b is None else b.detach())  # [..., out]

    def __getstate__(self) -> dict:
        """deepcopy / pickle / torch.save: drop the opaque oneDNN copy (it has no storage); it is rebuilt lazily."""
        state = self.__dict__.copy()
        state["_packed"] = None
        state["_packed_key"] = None
        return state

    def to_linear(self) -> nn.Linear:
        """A plain ``nn.Linear`` sharing this module's Parameters."""
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        lin.weight = self.weight
        lin.bias = self.bias
        return lin

    def extra_repr(self) -> str:
        plain = f", plain up to {self.plain_rows_max} rows" if self.plain_rows_max else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"packed=oneDNN{plain}")


def _replace_children(module: nn.Module, fn) -> int:
    count = 0
    for name, child in list(module.named_children()):
        new = fn(child)
        if new is not None:
            setattr(module, name, new)
            count += 1
        else:
            count += _replace_children(child, fn)
    return count


def prepack_linears(model: nn.Module, *, strict: bool = False) -> nn.Module:
    """Replace every fp32 CPU ``nn.Linear`` in ``model`` (in place, tied lm_head included) by a ``PackedLinear``.

    Embeddings and every other module are untouched, and so are linears on other devices (CUDA)
    or in other dtypes.  Weights are packed right away (so the first forward is not slower); a
    model moved to CUDA or cast afterwards simply runs ``F.linear``.  When the oneDNN path is
    unavailable (see ``packed_linear_available``) the model is returned unchanged, or, with
    ``strict=True``, a RuntimeError is raised.  Returns ``model``."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"prepack_linears expects a torch.nn.Module, got {type(model).__name__}")
    if not packed_linear_available():
        if strict:
            raise RuntimeError("the pre-packed oneDNN linear is not available in this PyTorch build (or disagrees with F.linear)")
        return model

    def swap(child: nn.Module) -> nn.Module | None:
        w = getattr(child, "weight", None)
        if (
            type(child) is nn.Linear  # exact type: leave subclasses (quantized, LoRA...) alone
            and w.device.type == "cpu" and w.dtype == torch.float32  # never on CUDA / meta, never other dtypes
            and not hasattr(child, "_hf_hook")  # accelerate offloading hooks live on the module: keep it
        ):
            packed = PackedLinear(child)
            packed.packed_weight()  # pack now, so the first forward is not slower
            return packed
        return None

    _replace_children(model, swap)
    return model


def unpack_linears(model: nn.Module) -> nn.Module:
    """Undo ``prepack_linears`` (in place): every ``PackedLinear`` becomes an ``nn.Linear`` again,
    sharing the same Parameters.  Returns ``model``."""
    _replace_children(model, lambda child: child.to_linear() if isinstance(child, PackedLinear) else None)
    return model


def count_packed(model: nn.Module) -> int:
    """How many ``PackedLinear`` modules ``model`` contains."""
    return sum(isinstance(m, PackedLinear) for m in model.modules())


def plain_rows(model: nn.Module) -> int:
    """The widest input (rows) that ``model``'s ``PackedLinear`` modules send through the plain weights: the largest
    of their thresholds (0: pre-packed at every width, or nothing packed)."""
    return max((m.plain_rows_max for m in model.modules() if isinstance(m, PackedLinear)), default=0)


def set_plain_rows(model: nn.Module, rows: int) -> int:
    """Route inputs of at most ``rows`` rows through the plain weights in every ``PackedLinear`` of ``model``
    (0: always packed).  Returns how many modules were set."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ValueError(f"rows must be an integer >= 0, got {rows!r}")
    mods = [m for m in model.modules() if isinstance(m, PackedLinear)]
    for m in mods:
        m.plain_rows_max = rows
    return len(mods)
