// report.html's inline script and style (profiler/html_assets.h).
#include "profiler/html_assets.h"

namespace memfit::html {

// Hover readout and drag-to-zoom over every chart (double-click resets). The readout shows the
// state that holds at the pointer's time; zooming sets the data layers' viewBox and redraws the
// time ticks (their round steps computed as html_chart.cpp does).
const char* const kReportScript = R"JS(
(function () {
  var tip = document.getElementById('tip');
  var UNITS = 1000;  // the data layers' viewBox width (html::kSpanUnits)
  function fmtBytes(b) {
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;
    while (b >= 1024 && i < 4) { b /= 1024; i++; }
    return (i ? b.toFixed(2) : b) + ' ' + u[i];
  }
  function nice(raw) {
    if (!(raw > 0)) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(raw)));
    var ms = [1, 2, 5, 10];
    for (var i = 0; i < ms.length; i++) if (ms[i] * p >= raw * (1 - 1e-12)) return ms[i] * p;
    return 10 * p;
  }
  // The time ticks of [t0, t1] ms, as html_chart.cpp draws them: a round step from the span,
  // labels in s once the axis reaches 2 s, none that would cross the frame's right edge.
  function ticks(svg, t0, t1) {
    var NS = 'http://www.w3.org/2000/svg';
    var l = +svg.dataset.l, t = +svg.dataset.t, w = +svg.dataset.w, h = +svg.dataset.h;
    var vw = svg.viewBox.baseVal.width, span = t1 - t0;
    svg.querySelectorAll('.xt, .xg').forEach(function (e) { e.remove(); });
    if (!(span > 0)) return;
    var sec = t1 >= 2000, unit = sec ? 1000 : 1;
    var step = nice(span / (span >= 2000 ? 1000 : 1) / (vw < 600 ? 3 : 6)) * (span >= 2000 ? 1000 : 1);
    var dec = 0;
    for (var s = step / unit; dec < 6 && Math.abs(s - Math.round(s)) > 1e-9; s *= 10) dec++;
    for (var v = Math.ceil(t0 / step) * step; v <= t1 + 1e-9 * span; v += step) {
      var x = l + w * (v - t0) / span;
      var g = document.createElementNS(NS, 'line');
      g.setAttribute('class', 'grid xg');
      g.setAttribute('x1', x); g.setAttribute('x2', x);
      g.setAttribute('y1', t); g.setAttribute('y2', t + h);
      svg.insertBefore(g, svg.querySelector('svg.plot'));
      var label = v === 0 ? '0' : (v / unit).toFixed(dec) + (sec ? ' s' : ' ms');
      if (x + 0.62 * 12 * label.length / 2 > vw - 2) continue;
      var e = document.createElementNS(NS, 'text');
      e.setAttribute('class', 'tick xt');
      e.setAttribute('x', x); e.setAttribute('y', t + h + 14);
      e.setAttribute('font-size', 12); e.setAttribute('text-anchor', 'middle');
      e.textContent = label;
      svg.appendChild(e);
    }
  }
  function zoom(svg, t0, t1) {
    var full0 = +svg.dataset.t0, full1 = +svg.dataset.t1, full = full1 - full0;
    svg.querySelectorAll('svg.plot').forEach(function (p) {
      var vb = p.viewBox.baseVal;
      p.setAttribute('viewBox', ((t0 - full0) / full * UNITS) + ' 0 ' +
                                ((t1 - t0) / full * UNITS) + ' ' + vb.height);
    });
    svg.classList.toggle('zoomed', t0 > full0 || t1 < full1);
    svg.dataset.v0 = t0; svg.dataset.v1 = t1;
    ticks(svg, t0, t1);
  }
  // The readout's lines, as text nodes: names come from users' specs.
  function show(lines, ev) {
    tip.textContent = '';
    lines.forEach(function (s, i) {
      var d = document.createElement(i === 0 ? 'b' : 'div');
      d.textContent = s;
      tip.appendChild(d);
    });
    tip.style.display = 'block';
    tip.style.left = Math.max(0, Math.min(ev.pageX + 12, window.innerWidth - tip.offsetWidth - 8)) + 'px';
    tip.style.top = (ev.pageY + 12) + 'px';
  }
  document.querySelectorAll('svg.chart').forEach(function (svg) {
    var data = JSON.parse(document.getElementById('data-' + svg.dataset.chart).textContent);
    var ov = svg.querySelector('.overlay'), sel = null, start = null;
    function timeAt(ev) {
      var m = svg.getScreenCTM();
      if (!m) return null;
      var pt = svg.createSVGPoint();
      pt.x = ev.clientX; pt.y = ev.clientY;
      var p = pt.matrixTransform(m.inverse());
      var v0 = +(svg.dataset.v0 || svg.dataset.t0), v1 = +(svg.dataset.v1 || svg.dataset.t1);
      var f = Math.min(1, Math.max(0, (p.x - svg.dataset.l) / svg.dataset.w));
      return {t: v0 + f * (v1 - v0), x: Math.min(+svg.dataset.l + +svg.dataset.w,
                                                 Math.max(+svg.dataset.l, p.x))};
    }
    function cancel() {
      if (sel) sel.remove();
      sel = null;
      start = null;
    }
    ov.addEventListener('mousemove', function (ev) {
      var at = timeAt(ev);
      if (!at || data.t.length === 0) return;
      var lo = 0, hi = data.t.length - 1;
      while (lo < hi) { var m = (lo + hi + 1) >> 1; if (data.t[m] <= at.t) lo = m; else hi = m - 1; }
      var lines = [at.t.toFixed(3) + ' ms',
                   'allocated ' + fmtBytes(data.a[lo]) +
                   (data.r[lo] ? ', reserved ' + fmtBytes(data.r[lo]) : '')];
      for (var k = 0; k < data.c.length; k++) {
        if (data.v[lo][k]) lines.push(data.c[k] + ' ' + fmtBytes(data.v[lo][k]));
      }
      var ph = data.n[data.p[lo]], bl = data.n[data.b[lo]];
      if (ph) lines.push('phase ' + ph);
      if (bl) lines.push('block ' + bl);
      show(lines, ev);
      if (start !== null && sel) {
        var a = Math.min(start.x, at.x), b = Math.max(start.x, at.x);
        sel.setAttribute('x', a); sel.setAttribute('width', b - a);
      }
    });
    ov.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
    ov.addEventListener('mousedown', function (ev) {
      cancel();
      start = timeAt(ev);
      if (!start) return;
      sel = document.createElementNS('http://www.w3.org/2000/svg', 'rect');
      sel.setAttribute('class', 'selection');
      sel.setAttribute('x', start.x); sel.setAttribute('width', 0);
      sel.setAttribute('y', svg.dataset.t); sel.setAttribute('height', svg.dataset.h);
      svg.insertBefore(sel, ov);
      ev.preventDefault();
    });
    // The drag ends wherever the button is released (inside the chart or not).
    window.addEventListener('mouseup', function (ev) {
      if (start === null) return;
      var end = timeAt(ev), a = start.t;
      cancel();
      if (!end) return;
      var lo = Math.min(a, end.t), hi = Math.max(a, end.t);
      var whole = (+svg.dataset.t1) - (+svg.dataset.t0);
      if (hi - lo > whole * 1e-4) zoom(svg, lo, hi);
    });
    ov.addEventListener('dblclick', function () { zoom(svg, +svg.dataset.t0, +svg.dataset.t1); });
  });
})();
)JS";

const char* const kReportStyle =
    "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1000px}"
    "h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.5em}"
    "table{border-collapse:collapse;margin:0.5em 0 1.5em;display:block;overflow-x:auto;"
    "max-width:100%}p{overflow-wrap:anywhere}"
    "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td+td{white-space:nowrap}"
    "td:first-child,th:first-child{text-align:left}"
    "th{background:#f4f4f4}.meta{color:#555}.scroll{overflow-x:auto}"
    "svg.chart{width:100%;height:auto;display:block}"
    "svg.wide{max-width:960px}svg.narrow{display:none;max-width:400px}"
    "@media (max-width:640px){body{margin:0.6em}svg.wide{display:none}svg.narrow{display:block}}"
    "svg .grid{stroke:#e2e2e2;stroke-width:1}svg .tick{fill:#555}svg .band{fill:#333}"
    "svg .area{stroke:none;opacity:0.9}"
    "svg .reserved{fill:none;stroke:#000;stroke-dasharray:4 3;stroke-width:1.2;"
    "vector-effect:non-scaling-stroke}"
    "svg .marker{stroke-width:1.2;vector-effect:non-scaling-stroke}"
    "svg .overlay{fill:transparent;cursor:crosshair}"
    "svg .selection{fill:rgba(80,120,200,0.2);pointer-events:none}"
    "svg.zoomed .band{display:none}"
    "#tip{position:absolute;display:none;background:#fff;border:1px solid #999;padding:4px 8px;"
    "font-size:12px;pointer-events:none;box-shadow:0 1px 4px rgba(0,0,0,0.2);line-height:1.4}"
    ".swatch{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;"
    "vertical-align:middle}";

}  // namespace memfit::html
