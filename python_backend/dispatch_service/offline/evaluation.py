"""The policy evaluation's report and command line
(``python -m dispatch_service.offline.evaluation``): Markdown tables, the targets, plots and
the model card's section.

Every policy is judged on the same simulated windows, every order counted. The policies
are defined in `evaluation_policies`, the runs and their summary in `evaluation_run`.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS
from dispatch_service.core.paths import MODEL_REPOSITORY, REPO_ROOT
from dispatch_service.core.repository_layout import SCORING_MODEL, model_layout
from dispatch_service.offline import simulator
from dispatch_service.offline.evaluation_policies import (
    BASELINE,
    MINUTES_ORACLE,
    default_policies,
)
from dispatch_service.offline.evaluation_run import (
    ORACLE_SHARES,
    EvaluationConfig,
    evaluate,
    weights_choice,
)

__all__ = [
    "ECE_BOUND",
    "HELD_OUT_GAIN",
    "SCARCE_GAIN",
    "TRAINED_GAIN",
    "calibration_table",
    "card_section",
    "default_weights_target",
    "gap_table",
    "main",
    "regime_table",
    "render_report",
    "targets",
    "training_cities",
    "weights_table",
    "write_plots",
]


def _ci(values: Sequence[float], digits: int, scale: float = 1.0) -> str:
    mean, low, high = (scale * v for v in values)
    return f"{mean:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def regime_table(regime: dict[str, Any]) -> str:
    """One regime's Markdown table: every policy, every order counted."""
    lines = [
        "| policy | assigned | mean delivery min | p90 min | late rate | mean cost CNY | "
        f"objective / order | mean delivery vs {BASELINE} [95% CI] | late rate vs {BASELINE} "
        f"(points) | objective vs {BASELINE} (x1000) | oracle gain captured: objective | "
        "oracle gain captured: late rate | minutes-oracle gain captured: minutes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, m in regime["policies"].items():
        versus = m.get("vs_" + BASELINE)
        delta = _ci(versus["mean_delivery"], 2) if versus else "-"
        late = _ci(versus["late_rate"], 1, 100.0) if versus else "-"
        objective = _ci(versus["objective"], 1, 1000.0) if versus else "-"
        captured = " | ".join(_share(m.get(key, float("nan"))) for _, _, _, key in ORACLE_SHARES)
        lines.append(
            f"| {name} | {m['assigned_rate']:.3f} | {m['mean_delivery']:.2f} | "
            f"{m['p90_delivery']:.1f} | {m['late_rate']:.3f} | {m['mean_cost']:.2f} | "
            f"{m['objective']:.4f} | {delta} | {late} | {objective} | {captured} |"
        )
    return "\n".join(lines)


def _share(value: float) -> str:
    return "-" if np.isnan(value) else f"{round(100 * value)} %"  # an int: never "-0 %"


def gap_table(regimes: Mapping[str, Any]) -> str:
    """Per regime, each model's distance to the minutes oracle in mean delivery minutes,
    split into the weights' price (the project-objective oracle less the minutes oracle,
    with what it buys: cost and late-rate differences) and prediction error's (the model
    less the project-objective oracle, under the same weights); 95 % intervals over
    windows."""
    lines = [
        "| regime | policy | to the minutes oracle (min) | weights' price (min) | "
        "prediction error's price (min) | what the weights buy: cost CNY / late rate "
        "(points), oracle less minutes oracle |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for regime, data in regimes.items():
        split = data.get("gap_split")
        if not split:
            continue
        weights = split["weights_price"]
        for name, price in split["prediction_price"].items():
            if not name.startswith("model"):
                continue
            total = (
                data["policies"][name]["mean_delivery"]
                - data["policies"][MINUTES_ORACLE]["mean_delivery"]
            )
            lines.append(
                f"| {regime} | {name} | {total:+.2f} | {_ci(weights['mean_delivery'], 2)} | "
                f"{_ci(price['mean_delivery'], 2)} | {_ci(weights['mean_cost'], 2)} / "
                f"{_ci(weights['late_rate'], 1, 100.0)} |"
            )
    return "\n".join(lines)


def calibration_table(regimes: Mapping[str, Any]) -> str:
    """On-time ECE and ETA error of every model policy, per regime, both pair sets."""
    lines = [
        "| regime | policy | pairs | on-time ECE (all / dispatched [95% CI]) | "
        "predicted vs realised on time (dispatched) | ETA MAE min (all / dispatched) | "
        "ETA bias min (all / dispatched [95% CI]) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for regime, data in regimes.items():
        for name, m in data["policies"].items():
            cal = m.get("calibration")
            if not cal:
                continue
            a, d = cal["all_pairs"], cal["dispatched"]
            ece_low, ece_high = d["ontime_ece_ci"]
            bias_low, bias_high = d["eta_bias_ci"]
            lines.append(
                f"| {regime} | {name} | {int(a['pairs'])} / {int(d['pairs'])} | "
                f"{a['ontime_ece']:.3f} / {d['ontime_ece']:.3f} "
                f"[{ece_low:.3f}, {ece_high:.3f}] | "
                f"{d['predicted_ontime']:.3f} vs {d['realised_ontime']:.3f} | "
                f"{a['eta_mae']:.2f} / {d['eta_mae']:.2f} | "
                f"{a['eta_bias']:+.2f} / {d['eta_bias']:+.2f} "
                f"[{bias_low:+.2f}, {bias_high:+.2f}] |"
            )
    return "\n".join(lines)


# Share of an oracle's gain over rule_eta a model must capture, on what that oracle
# optimises (`evaluation_run.ORACLE_SHARES`): in the cities it was trained on (default and
# peak), in a city it never saw (every regime), and in the scarce regimes of every city.
TRAINED_GAIN: Final = 0.85
HELD_OUT_GAIN: Final = 0.70
SCARCE_GAIN: Final = 0.50
ECE_BOUND: Final = 0.03


def training_cities(model_path: Path) -> tuple[str, ...]:
    """The cities a model was trained on, from the card beside it (() when it has none)."""
    card = model_path.parent / "model_card.json"
    if not card.is_file():
        return ()
    cities = json.loads(card.read_text()).get("data", {}).get("cities", [])
    return tuple(str(city) for city in cities)


def _shares(
    captured: Mapping[str, float], bound: float, late: Mapping[str, float] | None = None
) -> str:
    """The cells below ``bound`` with their share (and the share of the oracle's late-rate
    gain where given), else the lowest one."""
    below = {key: v for key, v in captured.items() if not v >= bound}  # NaN counts as below
    shown = below or dict([min(captured.items(), key=lambda kv: kv[1])])
    prefix = (
        f"{len(below)} of {len(captured)} below: " if below else f"all {len(captured)}; lowest "
    )

    def one(key: str, value: float) -> str:
        text = "no gain (the oracle is not better)" if np.isnan(value) else _share(value)
        if late is not None:
            text += f" (late rate: {_share(late[key]) if not np.isnan(late[key]) else 'no gain'})"
        return f"{key}: {text}"

    return prefix + ", ".join(one(key, v) for key, v in shown.items())


def targets(
    summary: dict[str, Any], model: str, trained: Sequence[str]
) -> list[tuple[str, bool, str]]:
    """The targets for one model policy over every city: (target, met, figures).
    ``trained``: the cities the model was trained on; the others count as held out. With a
    weights choice made with this model, the default weights' target comes first."""
    cities = summary["cities"]
    every = [(c, r, d) for c, data in cities.items() for r, d in data["regimes"].items()]
    out: list[tuple[str, bool, str]] = []
    choice = summary.get("weights_choice")
    if choice and choice.get("model") == model:
        out.append(default_weights_target(choice))
    above = {
        f"{c}/{r}": d["policies"][model]["windows_above_optimum_unassigned"] for c, r, d in every
    }
    out.append(
        (
            "unassigned <= the exact optimum's (distance matching) in every window",
            all(v == 0 for v in above.values()),
            ", ".join(f"{key}: {v}" for key, v in above.items() if v) or "0 windows above",
        )
    )
    misses = []
    for c, r, d in every:
        versus = d["policies"][model]["vs_" + BASELINE]
        if not (versus["mean_delivery"][2] < 0 and versus["late_rate"][2] < 0):
            misses.append(f"{c}/{r}")
    out.append(
        (
            f"beats {BASELINE} (same weights) on mean delivery and late rate, 95 % CI excludes "
            "0, every city and regime",
            not misses,
            "not in " + ", ".join(misses) if misses else f"all {len(every)}",
        )
    )

    trained_group = [c for c in cities if c in trained]
    scarce = [r for r, shape in summary["setup"]["regimes"].items() if shape["scarce"]]
    peak = ("default", "peak")
    split = "(default, peak; the rest is split into the weights' and prediction error's price)"
    # (cities, which of them, oracle, regimes (None: every one), where, bound)
    gains = (
        ("trained cities", trained_group, "oracle", peak, "(default, peak)", TRAINED_GAIN),
        ("trained cities", trained_group, MINUTES_ORACLE, peak, split, TRAINED_GAIN),
        (
            "held-out cities",
            [c for c in cities if c not in trained],
            "oracle",
            None,
            "in every regime judged",
            HELD_OUT_GAIN,
        ),
        ("scarce regimes", list(cities), "oracle", scarce, "in every city", SCARCE_GAIN),
    )
    for what, group, oracle, regimes, where, bound in gains:
        judged = [
            (f"{c}/{r}", d["policies"][model])
            for c in group
            for r, d in cities[c]["regimes"].items()
            if regimes is None or r in regimes
        ]
        shares = {cell: m.get(f"{oracle}_gain_captured") for cell, m in judged}
        if not shares or any(v is None for v in shares.values()):
            continue
        if oracle == MINUTES_ORACLE:
            whose, late = "delivery-minutes oracle's gain in mean delivery", None
        else:
            whose = "oracle's gain in the weighted objective (ground truth)"
            late = {cell: m.get("oracle_late_gain_captured", float("nan")) for cell, m in judged}
        out.append(
            (
                f"{what}: captures >= {100 * bound:.0f} % of the {whose} over {BASELINE} {where}",
                all(v >= bound for v in shares.values()),
                _shares(shares, bound, late),
            )
        )
    cal = {
        f"{c}/{r}": d["policies"][model]["calibration"]["dispatched"]
        for c, r, d in every
        if "calibration" in d["policies"][model]
    }
    above_bound = [key for key, v in cal.items() if v["ontime_ece"] > ECE_BOUND]
    worst = sorted(cal.items(), key=lambda kv: -kv[1]["ontime_ece"])[:3]
    out.append(
        (
            f"dispatched pairs: on-time ECE <= {ECE_BOUND} in every city and regime",
            not above_bound,
            f"{len(above_bound)} of {len(cal)} above; worst "
            + ", ".join(f"{key}: {v['ontime_ece']:.3f}" for key, v in worst),
        )
    )
    return out


def default_weights_target(choice: Mapping[str, Any]) -> tuple[str, bool, str]:
    """The default weights against the choice's one fixed baseline on the stated measure:
    fewer late orders (the 95 % interval below 0) and a mean delivery never significantly
    slower, in every city and regime."""
    default = ",".join(str(w) for w in DEFAULT_OBJECTIVE_WEIGHTS)
    name = (
        f"the default weights {default}: fewer late orders than `{BASELINE}` at "
        f"{','.join(str(w) for w in choice['baseline_weights'])} (95 % CI excludes 0) and "
        "mean delivery never significantly slower, every city and regime"
    )
    row = choice["candidates"].get(default)
    if row is None:
        return name, False, "the default is not among the candidates judged"
    cells = row["per_regime"]
    not_fewer = [cell for cell, v in cells.items() if not v["vs_baseline"]["late_rate"][2] < 0]
    slower = row["slower_than_rule"]
    worst = max(cells, key=lambda cell: cells[cell]["vs_baseline"]["late_rate"][2])
    figures = (
        f"fewer late in {len(cells) - len(not_fewer)} of {len(cells)}"
        + (f" (not in {', '.join(not_fewer)})" if not_fewer else "")
        + f"; slower in {', '.join(slower) or 'none'}; least sure: {worst} late rate "
        f"{_ci(cells[worst]['vs_baseline']['late_rate'], 1, 100.0)} points"
    )
    return name, not not_fewer and not slower, figures


def render_report(summary: dict[str, Any], models: Mapping[str, Sequence[str]]) -> str:
    """The Markdown report; ``models``: each model policy's training cities."""
    setup = summary["setup"]
    lines = [
        "# Dispatch policies in the simulator: every order counted",
        "",
        f"{setup['windows_per_regime']} held-out windows per regime and city "
        f"(evaluation seed {setup['seed']}), the same windows and noise for every policy; an "
        f"unassigned order counts as delivered {setup['unassigned_penalty_minutes']:.0f} "
        "minutes after its promise, and late. Intervals: paired bootstrap over windows "
        f"against `{BASELINE}` (negative = better). Policies: see "
        "`dispatch_service/offline/evaluation_policies.py`. The cities are simulated "
        "(`offline/simulator.py` over the registry's maps), not surveyed.",
        "",
        "A share of an oracle's gain over the rule ETA is measured on what that oracle "
        "optimises, the only quantity on which its gain is sure to be a gain. `oracle` "
        "maximises the request's weighted objective (the most orders, then the most total "
        "score of the served pairs, a score being the weighted utility of ETA, on-time "
        "probability and cost, `domain/scoring.py`): its share is on that objective evaluated "
        "on ground truth (`objective / order`: each served pair scored at the simulator's "
        "noise-free expectations with the load it is carried with, an unassigned order 0, "
        "averaged over orders), with the share of its late-rate gain beside it. "
        "`minutes_oracle` minimises delivery minutes: its share is on mean delivery minutes. "
        "Where an oracle gains nothing on its quantity the share is undefined ('-'); in scarce "
        "windows `oracle` gains little or nothing in minutes (it spends the few rider slots on "
        "orders that can still be on time), so a share of its minutes gain would mean "
        "nothing there.",
    ]
    for model, trained in models.items():
        held_out = [c for c in summary["cities"] if c not in trained]
        lines += [
            "",
            f"- {model}: trained on {', '.join(trained) or 'an unknown set of cities'}; "
            f"held out: {', '.join(held_out) or 'none'}",
        ]
    weights = tuple(setup.get("objective_weights", DEFAULT_OBJECTIVE_WEIGHTS))
    if weights != tuple(DEFAULT_OBJECTIVE_WEIGHTS):
        lines += [
            "",
            f"The scored policies resolve with OBJECTIVE_WEIGHTS {list(weights)} (latency, "
            f"on-time, cost), not the default {list(DEFAULT_OBJECTIVE_WEIGHTS)}.",
        ]
    for model, trained in models.items():
        lines += ["", f"## Targets: {model}", "", "| target | met | figures |"]
        lines += ["| --- | --- | --- |"]
        for name, met, figures in targets(summary, model, trained):
            lines.append(f"| {name} | {'met' if met else 'NOT met'} | {figures} |")
    for city, data in summary["cities"].items():
        lines += ["", f"## {city}"]
        for regime, regime_data in data["regimes"].items():
            shape = setup["regimes"][regime]
            lines += [
                "",
                f"### {city}: {regime} ({shape['orders']} orders, {shape['riders']} riders"
                f"{', scarce: spare capacity ~ orders' if shape['scarce'] else ''}"
                f"{', hours ' + str(tuple(shape['hours'])) if shape['hours'] else ''})",
                "",
                regime_table(regime_data),
            ]
        lines += ["", f"### {city}: calibration", "", calibration_table(data["regimes"])]
        if any("gap_split" in d for d in data["regimes"].values()):
            lines += [
                "",
                f"### {city}: the two oracles",
                "",
                "`oracle` is the best the project's weighted objective can do (ground truth, "
                "32 candidates, the request's weights); `minutes_oracle` serves the most "
                "orders and then minimises expected delivery minutes over every feasible "
                "pair, what users feel. A model's distance to the minutes oracle is the "
                "weights' price (with what the 32-candidate limit costs) plus prediction "
                "error's:",
                "",
                gap_table(data["regimes"]),
            ]
    return "\n".join(lines) + "\n"


def card_section(summary: dict[str, Any], model: str, trained: Sequence[str]) -> dict[str, Any]:
    """The model card's policy section: the summary and a ready Markdown rendering (its
    headings one level down, under the card's own section heading)."""
    lines = render_report(summary, {model: trained}).splitlines()[2:]  # the card has a title
    markdown = "\n".join("#" + line if line.startswith("#") else line for line in lines)
    return {"summary": summary, "markdown": markdown}


def write_plots(summary: dict[str, Any], out_dir: Path) -> list[Path]:
    """Mean delivery and late rate per city and regime, every policy (PNG, matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    columns = [(c, r) for c, data in summary["cities"].items() for r in data["regimes"]]
    first_city = next(iter(summary["cities"].values()))
    names = list(next(iter(first_city["regimes"].values()))["policies"])
    for key, label in (
        ("mean_delivery", "mean delivery minutes (all orders)"),
        ("late_rate", "late rate"),
    ):
        fig, ax = plt.subplots(figsize=(max(11, len(columns) * 0.6), 4.5))
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            values = [summary["cities"][c]["regimes"][r]["policies"][name][key] for c, r in columns]
            ax.bar(np.arange(len(columns)) + i * width, values, width, label=name)
        ticks = [f"{c}/{r}" for c, r in columns]
        ax.set_xticks(np.arange(len(columns)) + 0.4 - width / 2, ticks, rotation=60, fontsize=7)
        ax.set_ylabel(label)
        ax.legend(fontsize=8, ncol=4)
        fig.tight_layout()
        path = out_dir / f"{key}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def weights_table(choice: dict[str, Any]) -> str:
    """The candidates side by side, per city and regime, against the one fixed baseline, and
    the measure's choice."""
    rows = choice["candidates"]
    keys = list(rows)
    cells = list(next(iter(rows.values()))["per_regime"])
    base = choice.get("baseline_weights", [])
    lines = [
        f"Every candidate against `{BASELINE}` resolved with {base} (the same decisions for "
        "every candidate); per cell: mean delivery min / late %, and the late rate against "
        "the baseline in points [95 % CI].",
        "",
        "| city/regime | baseline | " + " | ".join(keys) + " |",
        "| --- | --- |" + " --- |" * len(keys),
    ]
    for cell in cells:
        baseline = choice.get("baseline", {}).get(cell)
        shown = (
            f"{baseline['mean_delivery']:.2f} / {100 * baseline['late_rate']:.1f}"
            if baseline
            else "-"
        )
        values = []
        for key in keys:
            v = rows[key]["per_regime"][cell]
            versus = v.get("vs_baseline")
            late = f" ({_ci(versus['late_rate'], 1, 100.0)})" if versus else ""
            values.append(f"{v['mean_delivery']:.2f} / {100 * v['late_rate']:.1f}{late}")
        lines.append(f"| {cell} | {shown} | " + " | ".join(values) + " |")
    lines.append(
        "| significantly slower than the baseline in | - | "
        + " | ".join(", ".join(rows[k]["slower_than_rule"]) or "none" for k in keys)
        + " |"
    )
    lines.append(
        "| significantly fewer late orders in | - | "
        + " | ".join(f"{len(rows[k].get('fewer_late_in', []))} of {len(cells)}" for k in keys)
        + " |"
    )
    default = ",".join(str(w) for w in DEFAULT_OBJECTIVE_WEIGHTS)
    verdict = "is" if choice["chosen"] == default else "is NOT"
    lines += [
        "",
        f"The measure (fewest late orders; mean delivery never significantly slower than the "
        f"baseline in any city and regime) picks {choice['chosen'] or 'none of them'}; the "
        f"default {default} {verdict} that choice.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch_service.offline.evaluation",
        description="Every policy on every regime's held-out windows, every order counted: "
        "writes report.md, summary.json and plots.",
    )
    parser.add_argument("--seed", type=int, default=EvaluationConfig.seed)
    parser.add_argument(
        "--windows", type=int, default=EvaluationConfig.windows, help="windows per regime (96)"
    )
    parser.add_argument("--regimes", default=",".join(simulator.REGIMES))
    parser.add_argument("--cities", default="", help="registered city ids (default: every one)")
    parser.add_argument(
        "--registry",
        default="",
        help="city registry file (default: the shipped one); cities the simulator has no "
        "knobs for get a world from their entry",
    )
    parser.add_argument("--versions", default="1,2", help="dispatch_model versions to judge")
    parser.add_argument(
        "--weights",
        default=",".join(str(w) for w in DEFAULT_OBJECTIVE_WEIGHTS),
        help="OBJECTIVE_WEIGHTS (latency,on-time,cost) the scored policies resolve with",
    )
    parser.add_argument(
        "--choose-weights",
        action="store_true",
        help="also judge WEIGHT_CANDIDATES with model version 1 and say which the default "
        "objective picks (about as long again)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="processes the (city, regime) cells run in (the same figures with any number)",
    )
    parser.add_argument("--repository", default=str(MODEL_REPOSITORY))
    parser.add_argument("--out-dir", default=str(REPO_ROOT / "evaluation" / "reports"))
    args = parser.parse_args(argv)
    repository = Path(args.repository)
    models = {
        f"model_v{v}": model_layout(repository, SCORING_MODEL).onnx(v)
        for v in args.versions.split(",")
        if v
    }
    try:
        weights = tuple(float(w) for w in args.weights.split(","))
    except ValueError:
        weights = ()
    if len(weights) != 3:
        parser.error(f"--weights takes 3 numbers (latency,on-time,cost), got {args.weights!r}")
    config = EvaluationConfig(
        seed=args.seed,
        windows=args.windows,
        regimes=tuple(args.regimes.split(",")),
        weights=(weights[0], weights[1], weights[2]),
        cities=tuple(c for c in args.cities.split(",") if c),
        registry=args.registry,
        repository=args.repository,
    )
    if args.jobs < 1:
        parser.error(f"--jobs takes a positive number, got {args.jobs}")
    build = functools.partial(default_policies, models, repository, config.weights)
    summary = evaluate(build, config, jobs=args.jobs)
    trained = {name: training_cities(path) for name, path in models.items()}
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.choose_weights:
        name, first = next(iter(models.items()))
        summary["weights_choice"] = {
            "model": name,
            **weights_choice(first, config, repository, jobs=args.jobs),
        }
    report = render_report(summary, trained)
    if args.choose_weights:
        report += f"\n## The default objective weights ({name})\n\n"
        report += weights_table(summary["weights_choice"]) + "\n"
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out_dir / "report.md").write_text(report)
    plots = write_plots(summary, out_dir)
    print(report)
    print(f"wrote {out_dir / 'report.md'}, {out_dir / 'summary.json'}, {len(plots)} plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
