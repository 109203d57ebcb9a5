#include "trace/html_page.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/json_input.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/core/units.hpp"

namespace kvlab {

namespace {

// The series' colours, in order (colour-blind-safe: Okabe and Ito's palette).
constexpr const char* palette[] = {"#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9"};

// The chart's box: plot area inside the margins, in SVG user units.
struct Frame {
    double w = 600, h = 260, left = 78, right = 12, top = 30, bottom = 40;
    double px(double x, double x_max) const { return left + (w - left - right) * (x_max > 0 ? x / x_max : 0.0); }
    double py(double y, double y_max) const { return h - bottom - (h - top - bottom) * (y_max > 0 ? y / y_max : 0.0); }
};

// A round step for about `n` ticks up to `top`: 1, 2 or 5 times a power of ten.
double tick_step(double top, int n) {
    if (top <= 0) return 1;
    const double raw = top / n, p = std::pow(10.0, std::floor(std::log10(raw)));
    for (const double m : {1.0, 2.0, 5.0})
        if (m * p >= raw) return m * p;
    return 10 * p;
}

// Decimal prefixes for counts (FLOPs, tokens): 1.50 M.
std::string si(double v) {
    static const char* prefixes[] = {"", "k", "M", "G", "T", "P"};
    int i = 0;
    while (std::abs(v) >= 1000 && i < 5) {
        v /= 1000;
        ++i;
    }
    return i == 0 ? fmt::format("{:.4g}", v) : fmt::format("{:.3g} {}", v, prefixes[i]);
}

// The axes, their ticks and labels, and the title.
std::string chart_axes(const ChartSpec& c, const Frame& f, double x_max, double y_max) {
    std::string s;
    double ys = tick_step(y_max, 5);
    if (c.y_kind == ValueKind::bytes) {  // round steps in the unit the labels use (KiB, MiB, GiB: 2^10..)
        double unit = 1;
        while (y_max / unit >= 1024) unit *= 1024;
        ys = tick_step(y_max / unit, 5) * unit;
    }
    const double xs = tick_step(x_max, 6);
    for (double y = 0; y <= y_max * 1.0001; y += ys)
        s += fmt::format("<line class=\"grid\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/><text class=\"tick\" x=\"{:.1f}\" y=\"{:.1f}\" "
                         "text-anchor=\"end\">{}</text>",
                         f.left, f.w - f.right, f.py(y, y_max), f.py(y, y_max), f.left - 4, f.py(y, y_max) + 4,
                         html_escape(format_value(y, c.y_kind)));
    for (double x = 0; x <= x_max * 1.0001; x += xs)
        s += fmt::format("<text class=\"tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>", f.px(x, x_max), f.h - f.bottom + 14,
                         html_escape(si(x)));
    s += fmt::format("<line class=\"axis\" x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\"/><line class=\"axis\" x1=\"{0}\" x2=\"{3}\" y1=\"{2}\" y2=\"{2}\"/>",
                     f.left, f.top, f.h - f.bottom, f.w - f.right);
    s += fmt::format("<text class=\"title\" x=\"{}\" y=\"18\">{}</text>", f.left, html_escape(c.title));
    s += fmt::format("<text class=\"label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>", (f.left + f.w - f.right) / 2, f.h - 6,
                     html_escape(c.x_label));
    s += fmt::format("<text class=\"label\" transform=\"rotate(-90)\" x=\"{:.1f}\" y=\"14\" text-anchor=\"middle\">{}</text>",
                     -(f.top + f.h - f.bottom) / 2, html_escape(c.y_label));
    return s;
}

// One series: its line, a point per value with its tooltip, and its legend entry.
std::string chart_series(const ChartSpec& c, std::size_t k, const Frame& f, double x_max, double y_max) {
    const ChartSeries& ser = c.series[k];
    const char* colour = palette[k % std::size(palette)];
    std::string line, points;
    for (std::size_t i = 0; i < ser.x.size(); ++i) {
        const bool clipped = ser.y[i] > y_max;
        const double x = f.px(ser.x[i], x_max), y = f.py(std::min(ser.y[i], y_max), y_max);
        line += fmt::format("{:.1f},{:.1f} ", x, y);
        const std::string tip = html_escape(fmt::format("{}: {} {}: {}", ser.name, c.x_label, si(ser.x[i]), format_value(ser.y[i], c.y_kind)));
        if (clipped)
            points += fmt::format("<path class=\"pt clip\" data-c=\"{}\" data-v=\"{:.9g}\" d=\"M{:.1f},{:.1f}l-4,7h8z\" fill=\"{}\"><title>{} (above the axis)</title></path>",
                                  c.id, ser.y[i], x, y, colour, tip);
        else
            points += fmt::format("<circle class=\"pt\" data-c=\"{}\" data-v=\"{:.9g}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"><title>{}</title></circle>",
                                  c.id, ser.y[i], x, y, colour, tip);
    }
    return fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>{}", colour, line, points);
}

// The legend under the x axis: a swatch and a name per series, wrapped onto more rows as needed. Returns
// the SVG and sets `height` to the chart's height with it.
std::string chart_legend(const ChartSpec& c, const Frame& f, double& height) {
    std::string s;
    double x = f.left, y = f.h + 4;
    for (std::size_t k = 0; k < c.series.size(); ++k) {
        const double width = 24 + 6.2 * static_cast<double>(c.series[k].name.size());
        if (x > f.left && x + width > f.w - f.right) {
            x = f.left;
            y += 15;
        }
        s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"10\" height=\"10\" fill=\"{}\"/><text class=\"legend\" x=\"{:.1f}\" y=\"{:.1f}\">{}</text>",
                         x, y, palette[k % std::size(palette)], x + 14, y + 9, html_escape(c.series[k].name));
        x += width;
    }
    height = c.series.empty() ? f.h : y + 18;
    return s;
}

}  // namespace

std::string html_escape(std::string_view text) {
    const std::string valid = to_valid_utf8(text);
    std::string out;
    out.reserve(valid.size());
    for (const char ch : valid) {
        switch (ch) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&quot;"; break;
        case '\'': out += "&#39;"; break;
        default: out += ch;
        }
    }
    return out;
}

std::string script_json(const nlohmann::json& value) {
    const std::string dumped = json_dump(value);
    std::string out;
    out.reserve(dumped.size());
    for (const char ch : dumped) {  // these bytes occur only inside strings, where \u escapes mean the same
        if (ch == '<') out += "\\u003c";
        else if (ch == '>') out += "\\u003e";
        else if (ch == '&') out += "\\u0026";
        else out += ch;
    }
    return out;
}

std::string format_value(double v, ValueKind kind) {
    switch (kind) {
    case ValueKind::count: return si(v);
    case ValueKind::bytes: return v < 0 ? fmt::format("{:.4g} B", v) : format_bytes(static_cast<std::uint64_t>(std::llround(v)), UnitSystem::iec);
    case ValueKind::ms: return fmt::format("{:.3g} ms", v);
    case ValueKind::percent: return fmt::format("{:.1f}%", v);
    case ValueKind::ratio: return fmt::format("{:.2f}x", v);
    case ValueKind::plain: break;
    }
    return fmt::format("{:.4g}", v);
}

ChartSpec make_chart(std::string id, std::string title, std::string x_label, std::string y_label, ValueKind kind) {
    ChartSpec c;
    c.id = std::move(id);
    c.title = std::move(title);
    c.x_label = std::move(x_label);
    c.y_label = std::move(y_label);
    c.y_kind = kind;
    return c;
}

ChartSeries make_series(std::string name, std::vector<double> x, std::vector<double> y) {
    ChartSeries s;
    s.name = std::move(name);
    s.x = std::move(x);
    s.y = std::move(y);
    return s;
}

ChartSpec modelled_time_chart(std::string id, const std::string& gpu_name, const std::string& why) {
    ChartSpec c = make_chart(std::move(id), fmt::format("modelled time so far on {} (counted, exact)", gpu_name), "step", "ms", ValueKind::ms);
    c.note = "Each step's max(FLOPs / BF16 peak, bytes / bandwidth), summed (docs/kv-memory.md, \"Modelled GPU time\"): the least time "
             "the counted work takes on that GPU, not a measurement. " + why;
    return c;
}

void add_running_total(ChartSeries& series, double x, double step_value) {
    series.x.push_back(x);
    series.y.push_back((series.y.empty() ? 0.0 : series.y.back()) + step_value);
}

std::string svg_chart(const ChartSpec& c) {
    const Frame f;
    double x_max = 0, y_max = 0;
    for (const ChartSeries& s : c.series) {
        for (const double x : s.x) x_max = std::max(x_max, x);
        for (const double y : s.y) y_max = std::max(y_max, y);
    }
    for (const auto& [label, y] : c.lines) y_max = std::max(y_max, y);
    if (c.y_top && *c.y_top < y_max) y_max = *c.y_top;
    y_max = y_max > 0 ? y_max * 1.08 : 1.0;
    x_max = std::max(x_max, 1.0);
    double height = f.h;
    const std::string legend = chart_legend(c, f, height);
    std::string svg = fmt::format("<svg id=\"{}\" class=\"chart\" viewBox=\"0 0 {} {:.0f}\" role=\"img\">", c.id, f.w, height) + chart_axes(c, f, x_max, y_max);
    for (std::size_t i = 0; i < c.lines.size(); ++i) {
        const auto& [label, y] = c.lines[i];
        svg += fmt::format("<line class=\"budget\" x1=\"{0:.1f}\" x2=\"{1:.1f}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\"><title>{3}</title></line>"
                           "<text class=\"legend\" x=\"{4:.1f}\" y=\"{5:.1f}\">{3}</text>",
                           f.left, f.w - f.right, f.py(y, y_max), html_escape(fmt::format("{}: {}", label, format_value(y, c.y_kind))),
                           f.left + 6 + 230.0 * static_cast<double>(i), f.py(y, y_max) - 4);
    }
    for (std::size_t k = 0; k < c.series.size(); ++k) svg += chart_series(c, k, f, x_max, y_max);
    svg += legend + "</svg>";
    const std::string note = c.note.empty() ? "" : fmt::format("<figcaption>{}</figcaption>", html_escape(c.note));
    return fmt::format("<figure class=\"chart\">{}{}</figure>\n", svg, note);
}

std::string table_html(const Table& t) {
    std::string s = fmt::format("<table><caption>{}</caption><thead><tr>", html_escape(t.title));
    for (const Column& c : t.columns) s += fmt::format("<th>{}</th>", html_escape(c.header.empty() ? c.key : c.header));
    s += "</tr></thead><tbody>";
    for (const auto& row : t.rows) {
        s += "<tr>";
        for (std::size_t i = 0; i < row.size(); ++i)
            s += fmt::format("<td{}>{}</td>", i < t.columns.size() && t.columns[i].align_right ? " class=\"num\"" : "", html_escape(row[i].text));
        s += "</tr>";
    }
    s += "</tbody></table>";
    for (const std::string& n : t.notes) s += fmt::format("<p class=\"note\">{}</p>", html_escape(n));
    return s + "\n";
}

}  // namespace kvlab

namespace kvlab {

namespace {

// The page's style: readable text, charts two to a row, the block map's cells.
constexpr const char* page_style = R"css(
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1260px;padding:0 16px;color:#222;background:#fff}
header{border-bottom:2px solid #0072b2;margin-bottom:16px}
p.headline{font-size:1.3em;font-weight:600;margin:.2em 0}
p.headline+p.headline{font-size:1.05em;font-weight:500}
p.source{color:#666;font-size:.9em}
h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
.charts{display:flex;flex-wrap:wrap;gap:12px}
figure.chart{margin:0;flex:1 1 580px;max-width:620px}
svg.chart{width:100%;height:auto;background:#fcfcfc;border:1px solid #e4e4e4}
svg .grid{stroke:#e8e8e8}svg .axis{stroke:#444}svg .budget{stroke:#c00;stroke-dasharray:6 3;stroke-width:1.5}
svg .tick,svg .legend{font-size:11px;fill:#333}svg .label{font-size:12px;fill:#333}svg .title{font-size:13px;font-weight:600;fill:#111}
svg .pt{cursor:crosshair}svg .pt:hover{stroke:#000;stroke-width:1.5}
figcaption,p.note{color:#555;font-size:.88em;margin:.3em 0}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em}caption{text-align:left;font-weight:600;padding:.3em 0}
th,td{border:1px solid #ddd;padding:3px 8px}th{background:#f3f6f9}td.num{text-align:right;font-variant-numeric:tabular-nums}
.exact{color:#1a7f37;font-weight:600}.measured{color:#b35900;font-weight:600}
ul.formulas li{margin:.35em 0;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.88em}
.maps{display:flex;flex-wrap:wrap;gap:28px}.map{flex:0 1 560px}.map h3{margin:.4em 0;font-size:1em}
.map .grid{display:grid;gap:2px;margin-top:8px}
.cell{width:20px;height:20px;border:1px solid #999;box-sizing:border-box}
.cell.free{background:#eee;border-color:#ddd}.cell.cached{background:#fff;border:1px dashed #555}
.cell.shared{outline:2px solid #000;outline-offset:-4px}
.controls{display:flex;gap:8px;align-items:center}.controls input{width:300px}.caption{font-size:.85em;color:#333;min-height:2.6em}
.legend span{display:inline-block;margin-right:14px}.legend .cell{display:inline-block;vertical-align:middle;margin-right:4px}
#tip{position:absolute;display:none;background:#222;color:#fff;padding:3px 7px;border-radius:3px;font-size:12px;pointer-events:none}
#kvlab-errors:empty{display:none}#kvlab-errors{color:#b00;border:1px solid #b00;padding:6px}
)css";

// First in <head>: every script error and console.error is written into the page (#kvlab-errors), where a
// reader and the browser test see it.
constexpr const char* error_hooks = R"js(
(function(){window.kvlabErrors=[];
function put(m){window.kvlabErrors.push(m);var e=document.getElementById('kvlab-errors');if(e)e.textContent+=m+'\n';}
window.addEventListener('error',function(ev){put('error: '+ev.message);});
var ce=console.error;console.error=function(){put('console.error: '+Array.prototype.join.call(arguments,' '));ce.apply(console,arguments);};})();
)js";

// Last in <body>: the points' tooltip, and the block maps (KV.maps) with their step sliders.
constexpr const char* page_script = R"js(
(function(){
var errs=document.getElementById('kvlab-errors');errs.textContent=window.kvlabErrors.map(function(m){return m+'\n';}).join('');
var tip=document.getElementById('tip');
document.addEventListener('mouseover',function(ev){var t=ev.target;
 if(!t.classList||!t.classList.contains('pt')){tip.style.display='none';return;}
 var ti=t.querySelector('title');tip.textContent=ti?ti.textContent:'';tip.style.display='block';
 tip.style.left=(ev.pageX+12)+'px';tip.style.top=(ev.pageY+12)+'px';});
function hue(o){return ((o*137.508)%360).toFixed(1);}
KV.maps.forEach(function(m,k){
 var root=document.getElementById('map-'+k),grid=root.querySelector('.grid'),cells=[];
 for(var c=0;c<m.n_cells;c++){var d=document.createElement('div');d.className='cell';grid.appendChild(d);cells.push(d);}
 var slider=root.querySelector('input'),label=root.querySelector('.caption'),btn=root.querySelector('button'),timer=null;
 slider.max=m.steps.length-1;
 function paint(i){var own=m.owner[i],fill=m.fill[i],sh={},held=0,cached=0,free=0,nsh=0,reqs={},rows=0;
  m.shared[i].forEach(function(c){sh[c]=1;});
  for(var c=0;c<m.n_cells;c++){var o=own[c],d=cells[c];
   if(o>=0){var f=(100*fill[c]/m.cell_rows).toFixed(1);held++;reqs[o]=1;rows+=fill[c];if(sh[c])nsh++;
    d.className='cell'+(sh[c]?' shared':'');
    d.style.background='linear-gradient(to top,hsl('+hue(o)+',62%,45%) '+f+'%,hsl('+hue(o)+',62%,86%) '+f+'%)';
    d.title='cell '+c+': request '+o+', '+fill[c]+' of '+m.cell_rows+' rows hold tokens'+(sh[c]?', shared by several requests':'');}
   else if(o==-2){cached++;d.className='cell cached';d.style.background='';d.title='cell '+c+': idle, kept for the prefix cache';}
   else{free++;d.className='cell free';d.style.background='';d.title='cell '+c+': free';}}
  label.textContent='step '+m.steps[i]+': '+held+' cells held by '+Object.keys(reqs).length+' requests ('+nsh+' shared), '+
   cached+' cached idle, '+free+' free; '+rows+' rows hold tokens';
  root.setAttribute('data-step',m.steps[i]);}
 slider.addEventListener('input',function(){paint(+slider.value);});
 btn.addEventListener('click',function(){
  if(timer){clearInterval(timer);timer=null;btn.textContent='play';return;}
  if(+slider.value>=m.steps.length-1)slider.value=0;
  btn.textContent='pause';
  timer=setInterval(function(){var v=+slider.value+1;
   if(v>=m.steps.length){clearInterval(timer);timer=null;btn.textContent='play';return;}
   slider.value=v;paint(v);},50);});
 slider.value=m.start;paint(m.start);});
document.body.setAttribute('data-ready','1');
})();
)js";

}  // namespace

std::string html_page(const std::string& title, const std::vector<std::string>& headline, const std::string& source_line,
                      const std::string& body, const nlohmann::json& data) {
    std::string page = fmt::format("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>{}</title>\n<style>{}</style>\n"
                                   "<script>{}</script>\n</head><body>\n<header>\n",
                                   html_escape(title), page_style, error_hooks);
    for (const std::string& line : headline) page += fmt::format("<p class=\"headline\">{}</p>\n", html_escape(line));
    page += fmt::format("<p class=\"source\">{}</p>\n</header>\n<pre id=\"kvlab-errors\"></pre>\n", html_escape(source_line));
    page += body;
    page += fmt::format("<div id=\"tip\"></div>\n<script>var KV={};</script>\n<script>{}</script>\n</body></html>\n", script_json(data), page_script);
    return page;
}

}  // namespace kvlab
