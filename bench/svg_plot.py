"""A small SVG line chart for bench/compare.py's context sweep: tok/s against context, one line
per engine and test, log-scaled context axis. Standalone SVG 1.1 (any browser shows it)."""
import math

COLORS = {"tandem": "#1f77b4", "llama.cpp": "#d62728"}


def _ticks(lo, hi, n=5):
    step = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(step)) if step > 0 else 1
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= step)
    t = math.floor(lo / step) * step
    out = []
    while t <= hi + 1e-9:
        if t >= lo - 1e-9:
            out.append(t)
        t += step
    return out


def line_chart(title, series, x_label="context (tokens already in the KV cache)", y_label="tokens/s",
               width=760, height=420):
    """series: list of (name, engine, dashed, [(context, tok_s), ...]). Context 0 sits at the
    axis's left end (the log axis starts at the smallest non-zero context / 2)."""
    ml, mr, mt, mb = 70, 190, 50, 55
    pw, ph = width - ml - mr, height - mt - mb
    xs = sorted({x for _, _, _, pts in series for x, _ in pts})
    nz = [x for x in xs if x > 0] or [1]
    x0 = min(nz) / 2
    lx = lambda x: math.log2(max(x, x0))
    xmin, xmax = lx(x0), lx(max(nz))
    ymax = max(y for _, _, _, pts in series for _, y in pts) * 1.08
    px = lambda x: ml + (lx(x) - xmin) / ((xmax - xmin) or 1) * pw
    py = lambda y: mt + ph - y / ymax * ph
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
         f'<rect width="{width}" height="{height}" fill="white"/>',
         f'<text x="{ml}" y="22" font-size="15" font-weight="bold">{title}</text>',
         f'<line x1="{ml}" y1="{mt + ph}" x2="{ml + pw}" y2="{mt + ph}" stroke="#333"/>',
         f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{mt + ph}" stroke="#333"/>']
    for x in xs:
        o.append(f'<line x1="{px(x):.1f}" y1="{mt}" x2="{px(x):.1f}" y2="{mt + ph}" stroke="#eee"/>')
        o.append(f'<text x="{px(x):.1f}" y="{mt + ph + 16}" text-anchor="middle">{x}</text>')
    for y in _ticks(0, ymax):
        o.append(f'<line x1="{ml}" y1="{py(y):.1f}" x2="{ml + pw}" y2="{py(y):.1f}" stroke="#eee"/>')
        o.append(f'<text x="{ml - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
    o.append(f'<text x="{ml + pw / 2}" y="{height - 12}" text-anchor="middle">{x_label}</text>')
    o.append(f'<text transform="translate(16,{mt + ph / 2}) rotate(-90)" text-anchor="middle">{y_label}</text>')
    for k, (name, engine, dashed, pts) in enumerate(series):
        color = COLORS.get(engine, "#555")
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(pts))
        dash = ' stroke-dasharray="6,4"' if dashed else ""
        o.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        for x, y in pts:
            o.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
        ly = mt + 10 + 20 * k
        o.append(f'<line x1="{ml + pw + 12}" y1="{ly}" x2="{ml + pw + 40}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>')
        o.append(f'<text x="{ml + pw + 46}" y="{ly + 4}">{name}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"
