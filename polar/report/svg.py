"""Small inline SVG charts for `polar report`: no plotting library, no script, no network at view time.
Each function returns one `<svg class="plot" data-plot=NAME>` element sized by its viewBox."""
from __future__ import annotations

import math
from html import escape
from typing import Mapping, Sequence

PALETTE = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5", "#9c6b4e")
STATUS_COLORS = {"completed": "#3ca951", "timeout": "#efb118", "error": "#ff725c"}
WIDTH = 560
LABEL_W = 175  # left margin for row labels
ROW_H = 22


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _fmt(v: float) -> str:
    if v == 0 or math.isnan(v):
        return "0" if v == 0 else "n/a"
    if abs(v) >= 1000 or v == int(v):
        return f"{v:,.0f}"
    return f"{v:.3g}"


def _svg(name: str, height: int, body: list[str], title: str) -> str:
    return (f'<svg class="plot" data-plot="{escape(name)}" viewBox="0 0 {WIDTH} {height}" role="img" '
            f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>{"".join(body)}</svg>')


def _text(x: float, y: float, s: str, anchor: str = "start", cls: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{cls}">{escape(s)}</text>'


def _clip(label: str, n: int = 27) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"


def _scale(lo: float, hi: float, x0: float, x1: float):
    span = (hi - lo) or 1.0
    return lambda v: x0 + (v - lo) / span * (x1 - x0)


def _axis(lo: float, hi: float, x: "callable", y_top: float, y_bottom: float) -> list[str]:
    out = []
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        out.append(f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{y_top}" y2="{y_bottom}" class="grid"/>')
        out.append(_text(x(v), y_bottom + 14, _fmt(v), "middle", "tick"))
    return out


def bars(name: str, title: str, items: Sequence[tuple[str, float]], unit: str = "",
         colors: Sequence[str] | None = None, lo: float | None = None, hi: float | None = None) -> str:
    """Horizontal bars, one per (label, value); negative values grow left of zero."""
    vals = [v for _, v in items if not math.isnan(v)] or [0.0]
    lo = min(0.0, min(vals)) if lo is None else lo
    hi = max(max(vals), 0.0) if hi is None else hi
    x = _scale(lo, hi if hi > lo else lo + 1, LABEL_W, WIDTH - 70)
    height = 30 + ROW_H * len(items) + 24
    body = _axis(lo, hi if hi > lo else lo + 1, x, 24, height - 24)
    body.append(_text(8, 14, f"{title}{f' ({unit})' if unit else ''}", cls="ptitle"))
    for i, (label, v) in enumerate(items):
        y = 28 + i * ROW_H
        body.append(_text(LABEL_W - 6, y + 13, _clip(label), "end", "label"))
        if math.isnan(v):
            body.append(_text(LABEL_W + 4, y + 13, "no value", cls="tick"))
            continue
        a, b = sorted((x(0.0 if lo <= 0 <= hi else lo), x(v)))
        fill = colors[i % len(colors)] if colors else color(0)
        body.append(f'<rect x="{a:.1f}" y="{y + 3}" width="{max(b - a, 1):.1f}" height="{ROW_H - 7}" '
                    f'fill="{fill}"><title>{escape(label)}: {_fmt(v)}</title></rect>')
        body.append(_text(b + 4, y + 13, _fmt(v), cls="value"))
    return _svg(name, height, body, title)


def stacked(name: str, title: str, rows: Sequence[tuple[str, Mapping[str, float]]], segments: Sequence[str],
            unit: str = "", colors: Mapping[str, str] | None = None) -> str:
    """Horizontal stacked bars: one row per label, segments in the given order, with a legend."""
    totals = [sum(max(0.0, d.get(s, 0.0)) for s in segments) for _, d in rows] or [0.0]
    x = _scale(0.0, max(totals) or 1.0, LABEL_W, WIDTH - 70)
    height = 52 + ROW_H * len(rows) + 24
    body = _axis(0.0, max(totals) or 1.0, x, 46, height - 24)
    body.append(_text(8, 14, f"{title}{f' ({unit})' if unit else ''}", cls="ptitle"))
    fills = {s: (colors or {}).get(s, color(i)) for i, s in enumerate(segments)}
    lx = LABEL_W
    for s in segments:
        body.append(f'<rect x="{lx}" y="24" width="10" height="10" fill="{fills[s]}"/>')
        body.append(_text(lx + 14, 33, s, cls="tick"))
        lx += 24 + 7 * len(s)
    for i, (label, d) in enumerate(rows):
        y, start = 50 + i * ROW_H, 0.0
        body.append(_text(LABEL_W - 6, y + 13, _clip(label), "end", "label"))
        for s in segments:
            v = max(0.0, d.get(s, 0.0))
            if v:
                body.append(f'<rect x="{x(start):.1f}" y="{y + 3}" width="{max(x(start + v) - x(start), 1):.1f}" '
                            f'height="{ROW_H - 7}" fill="{fills[s]}"><title>{escape(label)} {escape(s)}: '
                            f'{_fmt(v)}</title></rect>')
            start += v
        body.append(_text(x(start) + 4, y + 13, _fmt(start), cls="value"))
    return _svg(name, height, body, title)


def strip(name: str, title: str, rows: Sequence[tuple[str, Sequence[float]]], unit: str = "") -> str:
    """Dots per row on one shared axis (e.g. the rewards of each group), with the row mean as a tick."""
    vals = [v for _, vs in rows for v in vs] or [0.0]
    lo, hi = min(vals + [0.0]), max(vals + [0.0])
    lo, hi = (lo - 0.5, hi + 0.5) if hi == lo else (lo, hi)
    x = _scale(lo, hi, LABEL_W, WIDTH - 30)
    height = 30 + ROW_H * len(rows) + 24
    body = _axis(lo, hi, x, 24, height - 24)
    body.append(_text(8, 14, f"{title}{f' ({unit})' if unit else ''}", cls="ptitle"))
    for i, (label, vs) in enumerate(rows):
        y = 28 + i * ROW_H + ROW_H / 2
        body.append(_text(LABEL_W - 6, y + 4, _clip(label), "end", "label"))
        for j, v in enumerate(vs):
            body.append(f'<circle cx="{x(v):.1f}" cy="{y + (j % 5 - 2) * 3:.1f}" r="4.5" fill="{color(0)}" '
                        f'fill-opacity="0.7"><title>{escape(label)}: {_fmt(v)}</title></circle>')
        if vs:
            m = sum(vs) / len(vs)
            body.append(f'<line x1="{x(m):.1f}" x2="{x(m):.1f}" y1="{y - 8}" y2="{y + 8}" class="mean"/>')
    return _svg(name, height, body, title)


def histogram(name: str, title: str, series: Mapping[str, Sequence[float]], unit: str = "", bins: int = 20) -> str:
    """Counts of values in equal bins, one colour per series (stacked)."""
    vals = [v for vs in series.values() for v in vs] or [0.0]
    lo, hi = min(vals), max(vals)
    hi = hi if hi > lo else lo + 1
    width = (hi - lo) / bins
    counts = {k: [0] * bins for k in series}
    for k, vs in series.items():
        for v in vs:
            counts[k][min(int((v - lo) / width), bins - 1)] += 1
    top = max(sum(c[b] for c in counts.values()) for b in range(bins)) or 1
    x, height = _scale(lo, hi, 50, WIDTH - 20), 220
    y = _scale(0, top, height - 30, 40)
    body = _axis(lo, hi, x, 40, height - 30)
    body.append(_text(8, 14, f"{title}{f' ({unit})' if unit else ''}", cls="ptitle"))
    body.append(_text(44, 44, str(top), "end", "tick"))
    base = [0] * bins
    for i, (k, cs) in enumerate(counts.items()):
        body.append(f'<rect x="{50 + 130 * i}" y="22" width="10" height="10" fill="{color(i)}"/>')
        body.append(_text(64 + 130 * i, 31, _clip(k, 16), cls="tick"))
        for b, c in enumerate(cs):
            if c:
                x0, x1 = x(lo + b * width), x(lo + (b + 1) * width)
                body.append(f'<rect x="{x0:.1f}" y="{y(base[b] + c):.1f}" width="{max(x1 - x0 - 1, 1):.1f}" '
                            f'height="{y(base[b]) - y(base[b] + c):.1f}" fill="{color(i)}"><title>{escape(k)}: '
                            f'{c} in [{_fmt(lo + b * width)}, {_fmt(lo + (b + 1) * width)})</title></rect>')
                base[b] += c
    return _svg(name, height, body, title)


def scatter(name: str, title: str, series: Mapping[str, Sequence[tuple[float, float]]], xlabel: str,
            ylabel: str, joined: bool = False) -> str:
    """Points (x, y), one colour per series; `joined`: each series' points joined in order (a curve)."""
    pts = [p for ps in series.values() for p in ps] or [(0.0, 0.0)]
    x_hi = max(p[0] for p in pts) or 1.0
    y_hi = max(p[1] for p in pts) or 1.0
    height = 260
    x, y = _scale(0, x_hi, 60, WIDTH - 20), _scale(0, y_hi, height - 40, 40)
    body = _axis(0, x_hi, x, 40, height - 40)
    body.append(_text(8, 14, title, cls="ptitle"))
    body.append(_text(WIDTH / 2, height - 6, xlabel, "middle", "tick"))
    body.append(_text(54, 44, _fmt(y_hi), "end", "tick"))
    body.append(_text(54, height - 40, "0", "end", "tick"))
    body.append(_text(WIDTH - 20, 31, f"↑ {ylabel}", "end", "tick"))
    for i, (k, ps) in enumerate(series.items()):
        body.append(f'<rect x="{60 + 130 * i}" y="22" width="10" height="10" fill="{color(i)}"/>')
        body.append(_text(74 + 130 * i, 31, _clip(k, 16), cls="tick"))
        if joined and len(ps) > 1:
            line = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in ps)
            body.append(f'<polyline points="{line}" fill="none" stroke="{color(i)}" stroke-width="1.5"/>')
        body += [f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="4" fill="{color(i)}" fill-opacity="0.7">'
                 f'<title>{escape(k)}: {_fmt(a)} {escape(xlabel)}, {_fmt(b)} {escape(ylabel)}</title></circle>'
                 for a, b in ps]
    return _svg(name, height, body, title)
