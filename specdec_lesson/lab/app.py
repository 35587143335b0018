"""The "watch it decode" app of notebook 02: type a prompt, pick a drafter, K and a temperature, press Run.

It decodes the prompt twice with the same seed, plainly (one target forward per token) and speculatively
(with a :class:`~specdec_lesson.lab.trace.Trace`), and shows the speculative run as coloured text
(:func:`~specdec_lesson.lab.render.render_html`), its alpha / utilisation / tau, and both runs' tokens/s side
by side.  Every control is an attribute and :meth:`DecodeLab.run` does the work, so tests drive it headlessly::

    pair = load_default_pair()                     # drafters.pair: the target in its fastest form here + the draft
    lab = build_app(pair.target, pair.tokenizer, pair.draft)
    lab.k_slider.value = 3
    result = lab.run()                              # what the Run button does; result.html is lab.trace_html.value

Drafters come from a dict ``{name: factory(k) -> Drafter}`` (:func:`default_drafters`); a new option is one
more entry.  The only module of the package with ipywidgets besides ``sim.widget``.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from dataclasses import dataclass

import ipywidgets as widgets
import torch

from ..bench.tasks import chat
from ..distill.data import CODE_TEMPLATE
from ..drafters import Drafter, HybridDrafter, PromptLookupDrafter
from ..sampling import NonFiniteLogitsError
from ..speculative import autoregressive_generate, speculative_generate
from ..stats import SpecStats
from .render import render_html
from .trace import Trace

__all__ = ["DecodeLab", "LabResult", "build_app", "default_drafters", "DEFAULT_PROMPT"]

# a function in the benchmark's code format, written for this app (in no training or benchmark set)
DEFAULT_PROMPT = CODE_TEMPLATE.format(prompt='''def count_vowels(text: str) -> int:
    """Return how many vowels (a, e, i, o, u, either case) text contains.
    >>> count_vowels("Speculative decoding")
    8
    """
''')
DrafterFactory = Callable[[int], Drafter]


def default_drafters(target: torch.nn.Module, draft: Drafter | None = None, *,
                     probe_ids: torch.Tensor | None = None) -> dict[str, DrafterFactory]:
    """``{name: factory(k)}``: first (the app's default) the adaptive drafter (``drafters.adaptive.AdaptiveDrafter``
    over the hybrid, K chosen per step up to k; only when ``probe_ids`` [1, L] is given: its step costs are measured
    on it, a few seconds the first time each K is used), then the shipped distilled draft (``draft``, loaded for
    ``target`` on first use when None), prompt lookup, and the hybrid of both."""
    cache: dict = {} if draft is None else {"eagle": draft}

    def eagle(k: int) -> Drafter:
        if "eagle" not in cache:
            from ..drafters.eagle import load_default_draft

            cache["eagle"] = load_default_draft(target)
        return cache["eagle"]

    def hybrid(k: int) -> Drafter:
        return HybridDrafter(eagle(k), lookup_k=max(8, k))

    options: dict[str, DrafterFactory] = {}
    if probe_ids is not None:  # the adaptive drafter needs a prompt to measure its step costs on
        options["adaptive: K per step, up to K"] = _adaptive_factory(target, eagle, hybrid, probe_ids, cache)  # default
    options.update({
        "distilled draft (EAGLE-style)": eagle,
        "prompt lookup": lambda k: PromptLookupDrafter(),
        "hybrid: draft + prompt lookup": hybrid,
    })
    return options


def _adaptive_factory(target, eagle: DrafterFactory, hybrid: DrafterFactory, probe_ids: torch.Tensor,
                      cache: dict) -> DrafterFactory:
    """The hook for ``drafters.adaptive.AdaptiveDrafter``: the hybrid with K in 0..k chosen each step from the
    run's acceptance and this machine's step costs (measured once per k on ``probe_ids``)."""
    from ..drafters.adaptive import AdaptiveDrafter, measure_step_costs

    def make(k: int) -> Drafter:
        if ("costs", k) not in cache:
            cache["costs", k] = measure_step_costs(target, eagle(k), probe_ids, k)
        return AdaptiveDrafter(hybrid(k), cache["costs", k], k)

    return make


@dataclass
class LabResult:
    """One press of Run: both runs' tokens, texts, statistics and wall-clock seconds, the trace and its HTML."""

    prompt_ids: torch.Tensor  # [1, L]
    plain_tokens: list[int]
    spec_tokens: list[int]
    plain_text: str
    spec_text: str
    plain_seconds: float
    spec_seconds: float
    stats: SpecStats
    trace: Trace
    html: str

    @property
    def plain_tps(self) -> float:
        return len(self.plain_tokens) / self.plain_seconds

    @property
    def spec_tps(self) -> float:
        return len(self.spec_tokens) / self.spec_seconds


class DecodeLab:
    """Controls: ``prompt`` (Textarea, the user message; the chat template is applied), ``drafter`` (Dropdown),
    ``k_slider``, ``temperature``, ``max_new`` and ``run_button``.  Outputs: ``status``, ``trace_html``, ``speed``
    (HTML widgets).  ``ui`` is the whole box; :meth:`run` is the button's work."""

    def __init__(self, target: torch.nn.Module, tokenizer, drafters: dict[str, DrafterFactory], *,
                 prompt: str = DEFAULT_PROMPT, k: int = 4, temperature: float = 0.0, max_new_tokens: int = 64,
                 seed: int = 0) -> None:
        if not drafters:
            raise ValueError("drafters is empty: give at least one {name: factory(k) -> Drafter}")
        self.target, self.tokenizer, self.drafters, self.seed = target, tokenizer, dict(drafters), seed
        style, wide = {"description_width": "110px"}, widgets.Layout(width="420px")
        self.prompt = widgets.Textarea(value=prompt, description="prompt", style=style,
                                       layout=widgets.Layout(width="95%", height="140px"))
        self.drafter = widgets.Dropdown(description="drafter", options=list(self.drafters), style=style, layout=wide)
        self.k_slider = widgets.IntSlider(description="K (drafts)", value=k, min=1, max=16, style=style, layout=wide)
        self.temperature = widgets.FloatSlider(description="temperature", value=temperature, min=0.0, max=1.5, step=0.05,
                                               style=style, layout=wide)
        self.max_new = widgets.IntSlider(description="new tokens", value=max_new_tokens, min=8, max=256, step=8,
                                         style=style, layout=wide)
        self.run_button = widgets.Button(description="Run", button_style="primary", icon="play")
        self.status, self.trace_html, self.speed = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.run_button.on_click(self._clicked)
        self.ui = widgets.VBox([self.prompt, widgets.HBox([widgets.VBox([self.drafter, self.k_slider]),
                                                            widgets.VBox([self.temperature, self.max_new])]),
                                widgets.HBox([self.run_button, self.status]), self.trace_html, self.speed])
        self.last: LabResult | None = None

    def _ipython_display_(self) -> None:  # ``lab`` as the last line of a cell shows the app
        from IPython.display import display

        display(self.ui)

    def _clicked(self, _button) -> None:
        self.run_button.disabled = True
        self.status.value = "<i>decoding: plain, then speculative ...</i>"
        try:
            self.run()
        except (ValueError, RuntimeError, NonFiniteLogitsError) as exc:  # bad input or a model error: one line, in the app
            self.status.value = f"<span style='color:#a00'>error: {html.escape(str(exc))}</span>"
        finally:
            self.run_button.disabled = False

    def encode(self) -> torch.Tensor:
        """The prompt box as token ids [1, L] (the tokenizer's chat template applied when it has one)."""
        text = self.prompt.value
        if not text.strip():
            raise ValueError("the prompt is empty: type a prompt in the box")
        return self.tokenizer(chat(self.tokenizer, text), return_tensors="pt").input_ids  # [1, L]

    def run(self) -> LabResult:
        """Decode the prompt plainly and speculatively (same seed), update the outputs, return the result."""
        ids, k, n = self.encode(), self.k_slider.value, self.max_new.value
        temperature = float(self.temperature.value)
        drafter = self.drafters[self.drafter.value](k)
        autoregressive_generate(self.target, ids, 2)  # warm-up: first-call costs out of both timings
        t = time.perf_counter()
        plain, _ = autoregressive_generate(self.target, ids, n, temperature, generator=torch.Generator().manual_seed(self.seed))
        plain_s = time.perf_counter() - t
        trace = Trace()
        t = time.perf_counter()
        spec, stats = speculative_generate(self.target, drafter, ids, n, k=k, temperature=temperature,
                                           generator=torch.Generator().manual_seed(self.seed), trace=trace)
        spec_s = time.perf_counter() - t
        page = render_html(trace, self.tokenizer)
        result = LabResult(ids, plain[0].tolist(), spec[0].tolist(), self.tokenizer.decode(plain[0]),
                           self.tokenizer.decode(spec[0]), plain_s, spec_s, stats, trace, page)
        self.trace_html.value = page
        self.speed.value = _speed_html(result, temperature)
        self.status.value = (f"done: {html.escape(self.drafter.value)}, K = {k}, temperature {temperature:g}"
                             + _policy_note(drafter))
        self.last = result
        return result


def _policy_note(drafter: Drafter) -> str:
    """For an adaptive drafter: its steps per kind, and when it drafted nothing, the policy's reason (a learner
    sees why the trace has no green), e.g. a verify forward over 2-5 tokens that costs far more than one here."""
    kinds = getattr(drafter, "kinds", None)
    if not kinds:
        return ""
    note = "; steps: " + ", ".join(f"{kind} {n}" for kind, n in kinds.most_common())
    if not any(kinds[x] for x in ("draft", "probe", "lookup")):
        why = next((line for line in getattr(drafter, "decisions", []) if line.startswith("K=0:")), "")
        note += f" (the policy drafted nothing: {why[5:].strip()})" if why else ""
    return html.escape(note)


def _speed_html(r: LabResult, temperature: float) -> str:
    box = "display:inline-block;vertical-align:top;width:46%;margin-right:2%;font-family:sans-serif;font-size:13px"
    same = r.plain_tokens == r.spec_tokens
    note = (f"greedy outputs identical: {same}" if temperature == 0 else
            "sampled: each run draws its own text (both from the target's law)")
    cell = "<div style='{}'><b>{}</b><br><span style='font-size:22px'>{:.1f}</span> tokens/s<br>{} tokens in {:.2f} s{}</div>"
    return (cell.format(box, "plain decoding", r.plain_tps, len(r.plain_tokens), r.plain_seconds, "<br>one forward per token")
            + cell.format(box, "speculative decoding", r.spec_tps, len(r.spec_tokens), r.spec_seconds,
                          f"<br>speedup {r.spec_tps / r.plain_tps:.2f}x · {html.escape(note)}"))


def build_app(target: torch.nn.Module, tokenizer, draft: Drafter | None = None, *,
              drafters: dict[str, DrafterFactory] | None = None, **options) -> DecodeLab:
    """The app for ``target`` (``load_default_pair().target``: the form plain decoding runs fastest in on this CPU;
    the plain Hugging Face weights verify 2-5 tokens at about twice a token's cost on some CPUs, and the adaptive
    default then rightly drafts nothing), its tokenizer and the shipped distilled draft
    (``draft``; loaded on first use when None).  ``drafters`` replaces :func:`default_drafters`; ``options`` go
    to :class:`DecodeLab` (``prompt``, ``k``, ``temperature``, ``max_new_tokens``, ``seed``)."""
    if drafters is None:
        probe = tokenizer(chat(tokenizer, options.get("prompt", DEFAULT_PROMPT)), return_tensors="pt").input_ids  # [1, L]
        drafters = default_drafters(target, draft, probe_ids=probe)
    return DecodeLab(target, tokenizer, drafters, **options)
