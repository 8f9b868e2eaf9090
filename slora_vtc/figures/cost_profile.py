"""Figure 17: the A10G cost profile (prefill and decode time per request), our step-time model
fitted to it, and the paper's profiled cost function h against the measured per-request time."""

from pathlib import Path

import numpy as np

from slora_vtc.backends.sim import StepTimeModel
from slora_vtc.cost import ProfiledCost
from slora_vtc.data import A10G_PROFILE, data_file
from slora_vtc.figures.base import Figure, Results
from slora_vtc.figures.plot import panels, save
from slora_vtc.profile import load_profile


def draw(results: Results, out: Path) -> dict:
    points = load_profile(data_file(A10G_PROFILE))
    model = StepTimeModel.fit(points)
    paper_h, refit_h = (
        ProfiledCost(),
        ProfiledCost.fit([(p.input_len, p.output_len, 1000 * (p.prefill_s + p.decode_s)) for p in points]),
    )
    fig, axes = panels(3)

    inputs = sorted({p.input_len for p in points})
    measured_prefill = [np.mean([1000 * p.prefill_s for p in points if p.input_len == x]) for x in inputs]
    modelled_prefill = [
        np.mean(
            [
                1000 * model.prefill_time(p.batch_size, p.batch_size * x) / p.batch_size
                for p in points
                if p.input_len == x
            ]
        )
        for x in inputs
    ]
    axes[0].plot(inputs, measured_prefill, "o", label="measured (A10G)")
    axes[0].plot(inputs, modelled_prefill, "-", label="step-time model")
    axes[0].set(
        title="prefill time per request", xlabel="input length (tokens)", ylabel="ms", xscale="log", yscale="log"
    )

    for k, x in enumerate(x for x in inputs if sum(p.input_len == x for p in points) > 1):
        row = sorted((p for p in points if p.input_len == x), key=lambda p: p.output_len)
        axes[1].plot(
            [p.output_len for p in row],
            [1000 * p.decode_s for p in row],
            "o",
            color=f"C{k}",
            label=f"input {x} measured",
        )
        modelled = [
            1000
            * sum(model.decode_time(p.batch_size, p.batch_size * (x + s)) for s in range(1, p.output_len + 1))
            / p.batch_size
            for p in row
        ]
        axes[1].plot([p.output_len for p in row], modelled, "-", color=f"C{k}")
    axes[1].set(title="decode time per request (lines: model)", xlabel="output length (tokens)", ylabel="ms")

    total = np.array([1000 * (p.prefill_s + p.decode_s) for p in points])
    predicted = np.array([paper_h(p.input_len, p.output_len) for p in points])
    axes[2].plot(total, predicted, "o", label="paper's h(x, y)")
    axes[2].plot([total.min(), total.max()], [total.min(), total.max()], "k:", label="exact")
    axes[2].set(
        title="profiled cost h vs measured time",
        xlabel="measured ms per request",
        ylabel="h (ms)",
        xscale="log",
        yscale="log",
    )
    for ax in axes:
        ax.legend(fontsize="small")
    fig.suptitle("A10G / Llama-7B cost profile (paper Fig 17)")
    save(fig, out / "cost_profile.png")
    residuals = model.residuals(points)
    return {
        "prefill_rms_rel_err": round(float(np.sqrt(np.mean([r[1] ** 2 for r in residuals]))), 4),
        "decode_rms_rel_err": round(float(np.sqrt(np.mean([r[2] ** 2 for r in residuals]))), 4),
        "h_rms_rel_err": round(float(np.sqrt(np.mean(((predicted - total) / total) ** 2))), 4),
        "h_refit_coefficients": [round(c, 8) for c in refit_h.coefficients],
        "decode_over_prefill_same_tokens": _decode_over_prefill(points),
    }


def _decode_over_prefill(points) -> dict:
    """Paper: decoding n tokens costs 2-5x prefilling n tokens (same total token count)."""
    by_shape = {(p.input_len, p.output_len): p for p in points}
    ratios = {}
    for n in (64, 128, 256):
        decode_only, prefill_only = by_shape.get((8, n)), by_shape.get((n, 1))
        if decode_only and prefill_only:
            ratios[str(n)] = round(decode_only.decode_s / prefill_only.prefill_s, 2)
    return ratios


FIGURES = [Figure("cost_profile", "17", "cost profile, step-time model and profiled cost h", (), draw, (A10G_PROFILE,))]
