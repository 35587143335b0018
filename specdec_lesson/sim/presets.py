"""Hardware and model presets for the latency simulator.

Hardware numbers are vendor datasheet peaks (dense tensor-core bf16/fp16 FLOP/s, HBM/DRAM bandwidth,
per-GPU interconnect bandwidth in one direction); real kernels reach roughly 60-90 % of them.  Use
:func:`this_machine` with *measured* numbers (``specdec_lesson.profiling``) for the learner's computer.

Model shapes are the published Hugging Face configs; parameter counts are derived from the shapes
(Llama architecture: GQA attention, SwiGLU MLP, RMSNorm), so a custom model is one call to :func:`custom_model`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = [
    "Hardware", "ModelSpec", "PRECISION_BYTES", "HARDWARE", "MODELS", "this_machine", "custom_model",
    "smollm2_draft", "precision_bytes", "get_hardware", "get_model",
]

# bytes per parameter; int8/int4 are weight-only formats (the KV cache stays 16-bit, see ModelSpec.kv_bytes_per_token).
PRECISION_BYTES: dict[str, float] = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}


def precision_bytes(precision: str) -> float:
    if precision not in PRECISION_BYTES:
        raise ValueError(f"unknown precision {precision!r}; choose one of {sorted(PRECISION_BYTES)}")
    return PRECISION_BYTES[precision]


@dataclass(frozen=True)
class Hardware:
    """One accelerator (or CPU).  ``link_bandwidth``: bytes/s one GPU sends to the next in a ring
    all-reduce (one direction); ``link_latency``: seconds per ring hop; ``step_overhead``: fixed seconds
    per forward pass (kernel launches, Python, sampling) that neither bandwidth nor FLOPs explain."""

    name: str
    bandwidth: float  # bytes/s
    flops: float  # FLOP/s (16-bit dense tensor cores; fp32 for a CPU)
    memory: float  # bytes per device
    link_bandwidth: float = 0.0  # bytes/s per direction, 0: no multi-device support
    link_latency: float = 5e-7  # s per ring hop (NVLink; PCIe presets use 2e-6)
    step_overhead: float = 1e-4  # s per forward pass
    max_devices: int = 8

    @property
    def ridge_point(self) -> float:
        """FLOP/byte above which a kernel is compute bound (roofline knee)."""
        return self.flops / self.bandwidth


GB = 1e9
TB = 1e12

HARDWARE: dict[str, Hardware] = {
    h.name: h
    for h in [
        # NVLink 4: 900 GB/s total per GPU, 450 GB/s per direction.
        Hardware("H100 SXM", 3.35 * TB, 989e12, 80 * GB, link_bandwidth=450 * GB, step_overhead=3e-4),
        Hardware("H200", 4.8 * TB, 989e12, 141 * GB, link_bandwidth=450 * GB, step_overhead=3e-4),
        # NVLink 3: 600 GB/s total, 300 GB/s per direction.
        Hardware("A100 80GB", 2.039 * TB, 312e12, 80 * GB, link_bandwidth=300 * GB, step_overhead=3e-4),
        # PCIe Gen4 x16: ~32 GB/s per direction, no NVLink.
        Hardware("L40S", 864 * GB, 362e12, 48 * GB, link_bandwidth=32 * GB, link_latency=2e-6, step_overhead=3e-4),
        Hardware("RTX 4090", 1008 * GB, 165e12, 24 * GB, link_bandwidth=32 * GB, link_latency=2e-6, step_overhead=3e-4),
        # Apple M3 Max (40-core GPU): 400 GB/s unified memory, ~14 TFLOP/s fp16 on the GPU; one device.
        Hardware("Apple M3 Max laptop", 400 * GB, 14e12, 128 * GB, step_overhead=1e-3, max_devices=1),
    ]
}


def this_machine(bandwidth: float, flops: float, *, memory: float = 16 * GB, step_overhead: float = 2e-3,
                 name: str = "this machine") -> Hardware:
    """A preset from measured numbers: ``bandwidth`` bytes/s (``profiling.measure_bandwidth()``) and
    ``flops`` FLOP/s (``profiling.measure_matmul_flops()``).  Single device."""
    if not (bandwidth > 0 and flops > 0):
        raise ValueError(f"bandwidth and flops must be > 0, got bandwidth={bandwidth!r}, flops={flops!r}")
    return Hardware(name, float(bandwidth), float(flops), float(memory), step_overhead=step_overhead, max_devices=1)


@dataclass(frozen=True)
class ModelSpec:
    """A Llama-architecture decoder described by its shape."""

    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False
    extra_params: int = 0  # e.g. an EAGLE head's input projection

    def __post_init__(self) -> None:
        for field in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "intermediate", "vocab"):
            if int(getattr(self, field)) < 1:
                raise ValueError(f"{field} must be >= 1, got {getattr(self, field)!r}")

    @property
    def layer_params(self) -> int:
        attn = self.hidden * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)  # q, o, k, v
        mlp = 3 * self.hidden * self.intermediate  # gate, up, down
        return attn + mlp + 2 * self.hidden  # two RMSNorms

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def n_params(self) -> int:
        head = 0 if self.tied else self.embed_params
        return self.n_layers * self.layer_params + self.embed_params + head + self.hidden + self.extra_params

    @property
    def matmul_params(self) -> int:
        """Parameters that take part in a matmul for each token: everything but the embedding table,
        which is looked up (one row per token) unless it doubles as the output layer (tied)."""
        return self.n_params - (0 if self.tied else self.embed_params)

    def weight_bytes(self, precision: str = "bf16") -> float:
        """Bytes of all weights (what the model occupies)."""
        return self.n_params * precision_bytes(precision)

    def streamed_bytes(self, precision: str = "bf16") -> float:
        """Bytes one decode step reads from memory: the matmul weights (the untied embedding table is
        only looked up)."""
        return self.matmul_params * precision_bytes(precision)

    def kv_bytes_per_token(self, kv_bytes: float = 2.0) -> float:
        """KV cache per token: layers * 2 (K and V) * kv_heads * head_dim * bytes."""
        return self.n_layers * 2 * self.n_kv_heads * self.head_dim * kv_bytes


def custom_model(name: str = "custom", *, n_layers: int, hidden: int, n_heads: int, n_kv_heads: int | None = None,
                 head_dim: int | None = None, intermediate: int | None = None, vocab: int = 32000, tied: bool = False,
                 extra_params: int = 0) -> ModelSpec:
    """A Llama-shaped model; defaults: MHA, head_dim = hidden / n_heads, intermediate = 8/3 hidden."""
    return ModelSpec(name, n_layers, hidden, n_heads, n_kv_heads or n_heads, head_dim or hidden // n_heads,
                     intermediate or (8 * hidden) // 3, vocab, tied, extra_params)


def smollm2_draft(n_layers: int = 4, hidden: int = 256, intermediate: int = 768, n_heads: int = 4,
                  n_kv_heads: int = 4, vocab: int = 49152, name: str | None = None) -> ModelSpec:
    """The default target's small distilled draft: by default a 4-layer, hidden-256 Llama with the
    target's 49152-token tied vocabulary (about 16M parameters, 12.6M of them the embedding/head).
    Parameterise it to match the draft you actually ship (e.g. a reduced-vocabulary head)."""
    return ModelSpec(name or f"SmolLM2 draft ({n_layers}L/{hidden})", n_layers, hidden, n_heads, n_kv_heads,
                     hidden // n_heads, intermediate, vocab, tied=True)


def _smollm2_eagle(top_vocab: int = 8192) -> ModelSpec:
    # EAGLE-style head: fc(2h -> h) + one target-shaped decoder layer + the target's head restricted to top_vocab rows.
    return ModelSpec(f"SmolLM2 EAGLE head (1L, {top_vocab // 1024}k vocab)", 1, 576, 9, 3, 64, 1536, top_vocab,
                     tied=True, extra_params=2 * 576 * 576)


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec("Llama-3-70B", 80, 8192, 64, 8, 128, 28672, 128256),
        ModelSpec("Llama-3-8B", 32, 4096, 32, 8, 128, 14336, 128256),
        ModelSpec("Llama-3.2-1B", 16, 2048, 32, 8, 64, 8192, 128256, tied=True),
        ModelSpec("SmolLM2-135M", 30, 576, 9, 3, 64, 1536, 49152, tied=True),
        replace(smollm2_draft(), name="SmolLM2 draft (4L/256, 16M)"),
        _smollm2_eagle(),
    ]
}


def _preset(name, cls: type, table: dict, kind: str):
    if isinstance(name, cls):
        return name
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; presets: {list(table)}")
    return table[name]


def get_hardware(name: str | Hardware) -> Hardware:
    return _preset(name, Hardware, HARDWARE, "hardware")


def get_model(name: str | ModelSpec) -> ModelSpec:
    return _preset(name, ModelSpec, MODELS, "model")
