"""One candidate's section of the report: its verdict (status, reason, speedups with their
intervals, measurements, roofline, correctness trials, build, stage times), its source and,
when the store holds one, its episode transcript.
"""

from __future__ import annotations

import json
from typing import Any

from kerneljudge.suite.htmlreport.data import RunData
from kerneljudge.suite.htmlreport.markup import esc, kv_table, pre, status_badge, table
from kerneljudge.suite.store import StoredVerdict
from kerneljudge.verdict import TimingResult, Verdict

__all__ = ["candidate_section", "transcript_html"]

_MAX_MESSAGES = 20  # compiler messages listed per verdict


def _g(x: float | None, unit: str = "") -> str:
    return "-" if x is None else f"{x:.4g}{unit}"


def _interval(ci: tuple[float, float] | None) -> str:
    return "-" if not ci else f"{ci[0]:.4g}-{ci[1]:.4g}"


def _timing(v: Verdict) -> str:
    t = v.timing
    if t is None:
        return '<p class="note">Not timed.</p>'
    out = ["<h4>Speedups</h4>"]
    out.append(
        table(
            ["baseline", "median", "95% interval", "from samples", "from rounds"],
            [
                [
                    esc(s.baseline),
                    f"{s.median:.4g}x",
                    _interval(s.ci95),
                    _interval(s.ci95_samples),
                    _interval(s.ci95_rounds),
                ]
                for s in t.speedups
            ],
            numeric={1, 2, 3, 4},
        )
    )
    out.append(
        table(
            ["contestant", "samples", "median ms", "95% interval ms", "IQR ms", "min ms"],
            [
                [
                    esc(m.name),
                    str(m.samples),
                    _g(m.median_ms),
                    _interval(m.ci95_ms),
                    _g(m.iqr_ms),
                    _g(m.min_ms),
                ]
                for m in t.measurements
            ],
            numeric={1, 2, 3, 4, 5},
        )
    )
    items = [
        ("clock", esc(t.clock)),
        ("rounds / passes", f"{t.rounds} / {t.passes}"),
        ("stopped by", esc(t.stop_reason)),
    ]
    items += [(f"{k} not timed", esc(why)) for k, why in t.baseline_errors.items()]
    if t.host is not None:
        noisy = "noisy: " + "; ".join(t.host.noise_reasons) if t.host.noisy else "quiet"
        items.append(("host load", esc(noisy)))
    if t.timer_note:
        items.append(("timer note", esc(t.timer_note)))
    rl = t.roofline
    if rl is not None:
        items += [
            ("FLOPs / bytes per call", f"{_g(rl.flops)} / {_g(rl.bytes)}"),
            ("achieved", f"{_g(rl.achieved_tflops, ' TFLOP/s')}, {_g(rl.achieved_gbps, ' GB/s')}"),
        ]
        if rl.compute_fraction is None and rl.bandwidth_fraction is None:
            items.append(("of peak", "no peak figures for this device"))
        else:
            floor = _g(rl.floor_ms, " ms") + (" (the time is below it)" if rl.below_floor else "")
            items += [
                ("of peak compute", _g(rl.compute_fraction)),
                ("of peak bandwidth", _g(rl.bandwidth_fraction)),
                ("physical floor", floor),
            ]
        if rl.source:
            items.append(("peak figures from", esc(rl.source)))
    return "".join(out) + kv_table(items) + _graph(t)


def _graph(t: TimingResult) -> str:
    """The CUDA-graph replays' section (empty where the verdict has none)."""
    g = t.graph
    if g is None:
        return ""
    out = ["<h4>Graph replays (device time)</h4>"]
    if g.speedups:
        out.append(
            table(
                ["baseline", "replay speedup", "95% interval", "launched speedup's host range"],
                [
                    [
                        esc(s.baseline),
                        f"{s.median:.4g}x",
                        _interval(s.ci95),
                        _interval(g.host_range.get(s.baseline)),
                    ]
                    for s in g.speedups
                ],
                numeric={1, 2, 3},
            )
        )
    items = [(f"{n} waits for the host", f"{share:.0%}") for n, share in g.host_share.items()]
    items += [(f"{n} not replayed", esc(why)) for n, why in g.not_captured.items()]
    if g.note:
        items.append(("note", esc(g.note)))
    if g.error:
        items.append(("error", esc(g.error)))
    return "".join(out) + kv_table(items)


def _check(v: Verdict) -> str:
    c = v.check
    if c is None:
        return ""
    failed = [t for t in c.trials if not t.passed]
    rows = [
        [str(t.index), esc(t.shape_set), _g(t.max_abs_err), _g(t.oracle_err), esc(t.reason)]
        for t in failed
    ]
    out = (
        f"<h4>Correctness</h4><p>{c.n_passed}/{len(c.trials)} trials passed ({esc(c.mode)}, "
        f"atol {c.atol:.3g}, rtol {c.rtol:.3g}; worst max abs error "
        f"{c.worst('max_abs_err'):.3g})</p>"
    )
    if rows:
        out += table(["trial", "shapes", "max abs err", "vs float64", "reason"], rows)
    return out


def _build(v: Verdict) -> str:
    b = v.build
    if b is None:
        return ""
    state = "ok" if b.ok else ("timed out" if b.timed_out else "failed")
    out = (
        f"<h4>Build</h4><p>{esc(state)}, backend {esc(b.backend)}, "
        f"{'cached, ' if b.cached else ''}{b.duration_s:.3g} s</p>"
    )
    msgs = b.messages[:_MAX_MESSAGES]
    if msgs:
        out += table(
            ["severity", "file", "line", "candidate line", "message"],
            [
                [
                    esc(m.severity),
                    esc(m.file),
                    esc(m.line or "-"),
                    esc(m.candidate_line or "-"),
                    esc(m.message),
                ]
                for m in msgs
            ],
        )
    if b.log:
        out += f"<details><summary>build log</summary>{pre(b.log)}</details>"
    return out


def _verdict(row: StoredVerdict, v: Verdict | str | None) -> str:
    if not isinstance(v, Verdict):
        return f'<p class="note">{esc(v or "no verdict")}</p>'
    items = [
        ("status", status_badge(v.status.value)),
        ("reason", esc(v.reason or "-")),
        ("backend", esc(v.backend)),
        ("device", esc(v.device.name if v.device else row.device or "-")),
        ("candidate file", esc(row.candidate_path or "-")),
        ("source sha256", esc(row.candidate_sha256)),
        ("judged", esc(f"{v.started_at} to {v.finished_at} ({v.duration_s:.3g} s)")),
    ]
    if v.confinement:
        items.append(("confinement", esc(", ".join(v.confinement))))
    stages = table(
        ["stage", "seconds"],
        [[esc(k), f"{s:.3g}"] for k, s in v.stage_s.items()],
        numeric={1},
    )
    log = f"<details><summary>worker log</summary>{pre(v.worker_log)}</details>"
    return (
        kv_table(items)
        + _timing(v)
        + _check(v)
        + _build(v)
        + "<h4>Stage times</h4>"
        + stages
        + (log if v.worker_log else "")
    )


def _arguments(text: Any) -> str:
    """A tool call's arguments: JSON pretty-printed, long string fields (code) as blocks."""
    try:
        args = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        return pre(text)
    if not isinstance(args, dict):
        return pre(json.dumps(args, indent=2))
    short = {k: v for k, v in args.items() if not (isinstance(v, str) and "\n" in v)}
    out = pre(json.dumps(short, indent=2)) if short else ""
    for key, value in args.items():
        if key not in short:
            out += f"<div>{esc(key)}:</div>{pre(value)}"
    return out


def _record(rec: dict[str, Any]) -> str:
    kind = str(rec.get("type", "?"))
    t = rec.get("t")
    when = f" <small>t={esc(t)} s</small>" if t is not None else ""
    if kind == "message":
        role = str(rec.get("role", "?"))
        cls = role if role in ("system", "user", "assistant", "tool") else "other"
        return (
            f'<div class="msg msg-{cls}"><span class="role">{esc(role)}</span>{when}'
            f"{pre(rec.get('content', ''))}</div>"
        )
    if kind == "assistant":
        out = [
            f'<div class="msg msg-assistant"><span class="role">assistant, turn '
            f"{esc(rec.get('turn', '?'))}</span>{when}"
        ]
        if rec.get("reasoning"):
            out.append(f"<details><summary>reasoning</summary>{pre(rec['reasoning'])}</details>")
        if rec.get("content"):
            out.append(pre(rec["content"]))
        for call in rec.get("tool_calls") or []:
            out.append(
                f"<div>tool call <b>{esc(call.get('name', '?'))}</b> "
                f"<small>{esc(call.get('id', ''))}</small></div>"
                + _arguments(call.get("arguments"))
            )
        return "".join(out) + "</div>"
    if kind == "tool":
        facts = ", ".join(
            f"{k} {rec[k]}" for k in ("outcome", "reward", "duration_s", "done") if k in rec
        )
        error = f"<div>error: {esc(rec['error'])}</div>" if rec.get("error") else ""
        return (
            f'<div class="msg msg-tool"><span class="role">tool result: '
            f"{esc(rec.get('name', '?'))}</span>{when} <small>{esc(facts)}</small>{error}"
            f"{pre(rec.get('observation', ''))}</div>"
        )
    rest = {k: v for k, v in rec.items() if k not in ("type", "t")}
    return (
        f'<div class="msg"><span class="role">{esc(kind)}</span>{when}'
        f"<details><summary>fields</summary>{pre(json.dumps(rest, indent=2, default=str))}"
        "</details></div>"
    )


def transcript_html(records: list[Any]) -> str:
    """An episode transcript (the records of :mod:`kerneljudge.agent.transcript`): messages,
    the model's replies with their tool calls, tool results, and the other records' fields."""
    parts = []
    for rec in records:
        parts.append(_record(rec) if isinstance(rec, dict) else pre(json.dumps(rec)))
    return "".join(parts)


def candidate_section(run: RunData, row: StoredVerdict, verdict: Verdict | str | None) -> str:
    """The section of one stored verdict, with the id :meth:`RunData.candidate_anchor`."""
    episode = ""
    if row.transcript is not None:
        episode = f"<h4>Episode transcript ({len(row.transcript)} records)</h4>" + transcript_html(
            row.transcript
        )
    return (
        f'<section class="cand" id="{run.candidate_anchor(row)}">'
        f"<h3>{esc(row.problem)} / {esc(row.sample)} <small>run {esc(run.label)}</small>"
        f'<a class="up" href="#{run.anchor}-candidates">back to the index</a></h3>'
        + _verdict(row, verdict)
        + "<h4>Source</h4>"
        + pre(row.candidate_source)
        + episode
        + "</section>"
    )
