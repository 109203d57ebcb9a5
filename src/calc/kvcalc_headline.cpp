// kvcalc's headline (1-3 lines before the tables), built from the facts run_kvcalc recorded beside its cells.
#include "calc/kvcalc_headline.hpp"
#include "calc/kvcalc_pp.hpp"

#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvlab/calc/engine.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/core/units.hpp"

namespace kvlab {
namespace {

using Fit = CaseFacts::Fit;

// "batch 8 at 32,768 tokens"
std::string batch_at(std::uint64_t batch, std::uint64_t context) {
    return fmt::format("batch {} at {} tokens", batch, with_thousands(context));
}

// A case as one line of several names it: "llama-3-8b fp16", with the layout when more than one is sized.
std::string case_label(const CaseFacts& c, const KvcalcRequest& r) {
    return r.variants.size() > 1 ? fmt::format("{} {} {}", c.model, c.attention, c.dtype) : fmt::format("{} {}", c.model, c.dtype);
}

// The weights' share of a GPU, as the fit table's title and weights/GPU column give it.
std::string weights_clause(const CaseFacts& c, const KvcalcRequest& r) {
    return r.tp > 1 || r.pp > 1 ? fmt::format("{} of weights per GPU at {}", format_bytes(c.weights_gpu, r.units), parallel_label(r.tp, r.pp))
                    : fmt::format("{} of weights", format_bytes(c.weights_gpu, r.units));
}

// The point a case's answer is about: the largest batch's KV that does not fit, else the largest that does.
const Fit& focus_point(const CaseFacts& c) {
    const Fit* best = nullptr;
    for (const auto& f : c.fits) {
        const bool better = !best || (best->fits && !f.fits) || (best->fits == f.fits && f.kv_gpu >= best->kv_gpu);
        if (better) best = &f;
    }
    return *best;
}

// "the weights alone need 131.42 GiB per GPU at TP 1, more than the 20.24 GiB usable; --tp 8 fits them"
std::string weights_verdict(const CaseFacts& c, const KvcalcRequest& r) {
    return fmt::format("does not fit: the weights alone need {} per GPU at {}, more than the {} usable; {}", format_bytes(c.weights_gpu, r.units),
                       parallel_label(r.tp, r.pp), format_bytes(c.usable, r.units),
                       c.tp_needed ? fmt::format("--tp {} fits them", c.tp_needed) : std::string("no TP that divides its heads fits them"));
}

// The verdict on a case's focus point, with the counts when several (context, batch) were asked.
std::string fit_verdict_line(const CaseFacts& c, const KvcalcRequest& r) {
    if (!c.weights_fit) return weights_verdict(c, r);
    const Fit& f = focus_point(c);
    const auto n_no = static_cast<std::size_t>(std::count_if(c.fits.begin(), c.fits.end(), [](const Fit& x) { return !x.fits; }));
    const auto U = r.units;
    // one point: "does not fit: batch 8 at 32,768 tokens needs ..."; several: "2 of 4 do not fit; the largest, batch ..., needs ..."
    std::string lead = fmt::format("{}: {}", f.fits ? "fits" : "does not fit", batch_at(f.batch, f.context));
    if (c.fits.size() > 1)
        lead = fmt::format("{} the largest, {},",
                           f.fits ? (c.fits.size() == 2 ? std::string("both fit;") : fmt::format("all {} fit;", c.fits.size()))
                                  : fmt::format("{} of {} {} not fit;", n_no, c.fits.size(), n_no == 1 ? "does" : "do"),
                           batch_at(f.batch, f.context));
    if (!f.fits)
        return fmt::format("{} needs {} of KV per GPU; {} is free after the weights ({})", lead, format_bytes(f.kv_gpu, U),
                           format_bytes(c.kv_budget, U), weights_clause(c, r));
    return fmt::format("{} needs {} of KV per GPU of the {} free after the weights ({}): {} to spare", lead, format_bytes(f.kv_gpu, U),
                       format_bytes(c.kv_budget, U), weights_clause(c, r), format_bytes(c.kv_budget - f.kv_gpu, U));
}

// What fits instead of the focus point (the largest batch at its context, the longest context at its
// batch), or, when it fits, the room left and the decode roofline's time.
std::string fit_detail_line(const CaseFacts& c, const KvcalcRequest& r) {
    const Fit& f = focus_point(c);
    if (f.fits) {
        std::string room = f.max_batch ? fmt::format("room for up to {}", batch_at(*f.max_batch, f.context)) : std::string();
        if (!f.ms_per_step) return room;
        return fmt::format("{}{}decode at best {:.3f} ms/step, {:.1f} tok/s (roofline: weights and KV read once per step at {})", room,
                           room.empty() ? "" : "; ", *f.ms_per_step, *f.tokens_per_s, format_rate(r.gpu->bandwidth_bytes_per_s));
    }
    std::vector<std::string> alt, none;
    if (f.max_batch && *f.max_batch > 0) alt.push_back(batch_at(*f.max_batch, f.context));
    if (f.max_batch && *f.max_batch == 0) none.push_back(fmt::format("not even batch 1 at {} tokens", with_thousands(f.context)));
    if (f.max_context > 0)
        alt.push_back(fmt::format("{} tokens{} at batch {}", with_thousands(f.max_context), f.max_context_is_model_max ? " (the model's max)" : "", f.batch));
    else
        none.push_back(fmt::format("not one token at batch {}", f.batch));
    if (alt.empty()) return fmt::format("nothing fits: {}", fmt::join(none, ", "));
    return fmt::format("fits: {}{}{}", fmt::join(alt, ", or "), none.empty() ? "" : "; ", fmt::join(none, ", "));
}

// With a GPU: one case in up to 2 lines; 2-3 cases one line each; more: the count, the largest that does
// not fit and the largest that does.
std::vector<std::string> gpu_headline(const std::vector<CaseFacts>& cases, const KvcalcRequest& r) {
    std::vector<std::string> h;
    if (cases.size() == 1) {
        h.push_back(fit_verdict_line(cases[0], r));
        if (cases[0].weights_fit)
            if (auto d = fit_detail_line(cases[0], r); !d.empty()) h.push_back(std::move(d));
        return h;
    }
    if (cases.size() <= 3) {
        for (const auto& c : cases) h.push_back(fmt::format("{}: {}", case_label(c, r), fit_verdict_line(c, r)));
        return h;
    }
    std::size_t n = 0, n_no = 0;
    const CaseFacts *worst = nullptr, *best = nullptr;
    // how far a case is from fitting: its largest batch's KV over the budget (weights that do not fit: worst of all)
    auto shortfall = [](const CaseFacts& c) {
        if (!c.weights_fit || c.kv_budget == 0) return std::numeric_limits<double>::infinity();
        double most = 0.0;
        for (const Fit& f : c.fits) most = std::max(most, static_cast<double>(f.kv_gpu) / static_cast<double>(c.kv_budget));
        return most;
    };
    for (const auto& c : cases) {
        const bool all_fit = c.weights_fit && std::all_of(c.fits.begin(), c.fits.end(), [](const Fit& f) { return f.fits; });
        n += c.weights_fit ? c.fits.size() : c.sizes.size();
        n_no += c.weights_fit ? static_cast<std::size_t>(std::count_if(c.fits.begin(), c.fits.end(), [](const Fit& f) { return !f.fits; }))
                              : c.sizes.size();
        if (!all_fit && (!worst || shortfall(c) > shortfall(*worst))) worst = &c;  // the first of equals
        if (all_fit && !best) best = &c;
    }
    if (n_no == 0)
        h.push_back(fmt::format("on {}, all {} cases asked (model × dtype × context × batch) fit", r.gpu->name, n));
    else
        h.push_back(fmt::format("on {}, {} of the {} cases asked (model × dtype × context × batch) {} not fit", r.gpu->name, n_no, n,
                                n_no == 1 ? "does" : "do"));
    if (worst) h.push_back(fmt::format("{}: {}", case_label(*worst, r), fit_verdict_line(*worst, r)));
    if (best) h.push_back(fmt::format("{}: {}", case_label(*best, r), fit_verdict_line(*best, r)));
    return h;
}

// With --kv-budget: the blocks the budget holds and the requests they serve at once.
std::string budget_line(const CaseFacts& c, const KvcalcRequest& r, bool labelled) {
    std::vector<std::string> at;
    for (const auto& [t, conc] : c.concurrency)
        at.push_back(fmt::format("{:.2f}x at {} tokens{}", conc, with_thousands(t), at.empty() ? " per request" : ""));
    return fmt::format("{}{} of KV per GPU holds {} blocks of {} tokens ({} tokens): max concurrency {}", labelled ? case_label(c, r) + ": " : "",
                       format_bytes(*r.kv_budget, r.units), with_thousands(c.n_blocks), c.block_size, with_thousands(c.n_tokens),
                       fmt::join(at, ", "));
}

// One line per case while they fit in max_lines, the last line saying how many more the table has.
std::vector<std::string> budget_headline(const std::vector<CaseFacts>& cases, const KvcalcRequest& r, std::size_t max_lines) {
    const bool more = cases.size() > max_lines && max_lines > 1;
    const std::size_t n_shown = std::min(cases.size(), more ? max_lines - 1 : max_lines);
    std::vector<std::string> h;
    for (std::size_t i = 0; i < n_shown; ++i) h.push_back(budget_line(cases[i], r, cases.size() > 1 || r.variants.size() > 1));
    if (more) h.push_back(fmt::format("and {} more in the KV budget table", counted(static_cast<long long>(cases.size() - n_shown), "case")));
    return h;
}

// The largest KV a model's sizes reach, and the case it is in.
struct LargestSize {
    const CaseFacts* c = nullptr;
    CaseFacts::Size size;
};
LargestSize largest_size(const std::vector<const CaseFacts*>& cases) {
    LargestSize out;
    for (const auto* c : cases)
        for (const auto& s : c->sizes)
            if (!out.c || s.bytes_batch > out.size.bytes_batch) out = {c, s};
    return out;
}

// "llama-3-8b keeps 128.00 KiB of KV per token (fp16, GQA-8); 4,096 tokens × batch 1 = 512.00 MiB", with
// each layout and dtype asked when there are several, and the largest size asked.
std::string model_size_line(const std::vector<const CaseFacts*>& cases, const KvcalcRequest& r) {
    const auto U = r.units;
    const CaseFacts& first = *cases.front();
    const bool many_att = r.variants.size() > 1, many_dt = r.dtypes.size() > 1;
    auto which = [&](const CaseFacts& c) {
        return many_att && many_dt ? fmt::format("{} {}", c.attention, c.dtype) : many_att ? c.attention : c.dtype;
    };
    std::string line;
    if (cases.size() == 1) {
        line = fmt::format("{} keeps {} of KV per token ({}, {})", first.model, format_bytes(first.bytes_per_token, U), first.dtype, first.attention_kind);
    } else {
        std::vector<std::string> items;
        for (std::size_t i = 0; i < cases.size() && i < 4; ++i)
            items.push_back(fmt::format("{}{} {}", format_bytes(cases[i]->bytes_per_token, U), i == 0 ? " of KV per token" : "",
                                        many_att && !many_dt ? "as " + which(*cases[i]) : "in " + which(*cases[i])));
        if (cases.size() > 4) items.push_back("...");
        line = fmt::format("{} keeps {}{}", first.model, fmt::join(items, ", "),
                           many_att && many_dt ? "" : fmt::format(" ({})", many_att ? first.dtype : first.attention_kind));
    }
    std::size_t n_sizes = 0;
    for (const auto* c : cases) n_sizes += c->sizes.size();
    const LargestSize big = largest_size(cases);
    const auto& s = big.size;
    const std::string per_gpu =
        r.tp > 1 || r.pp > 1 ? fmt::format(" ({} per GPU at {})", format_bytes(s.bytes_batch_gpu, U), parallel_label(r.tp, r.pp)) : "";
    if (n_sizes == 1) return fmt::format("{}; {} tokens × batch {} = {}{}", line, with_thousands(s.context), s.batch, format_bytes(s.bytes_batch, U), per_gpu);
    return fmt::format("{}; the largest asked, {} tokens × batch {}{}, takes {}{}", line, with_thousands(s.context), s.batch,
                       cases.size() > 1 ? std::string(" ") + (many_att && !many_dt ? "as " : "in ") + which(*big.c) : "", format_bytes(s.bytes_batch, U), per_gpu);
}

// Without a GPU or budget: the KV per token and per batch, a line per model (up to 3), else the range.
std::vector<std::string> kv_size_headline(const std::vector<CaseFacts>& cases, const KvcalcRequest& r) {
    std::vector<std::vector<const CaseFacts*>> models;  // cases grouped by model, in order
    for (const auto& c : cases) {
        if (models.empty() || models.back().front()->model != c.model) models.emplace_back();
        models.back().push_back(&c);
    }
    std::vector<std::string> h;
    if (models.size() <= 3) {
        for (const auto& m : models) h.push_back(model_size_line(m, r));
        return h;
    }
    const auto [lo, hi] = std::minmax_element(cases.begin(), cases.end(), [](const CaseFacts& a, const CaseFacts& b) {
        return a.bytes_per_token < b.bytes_per_token;
    });
    auto name = [&](const CaseFacts& c) { return fmt::format("{} {} {}", c.model, c.attention_kind, c.dtype); };
    h.push_back(fmt::format("{} models: KV per token from {} ({}) to {} ({})", models.size(), format_bytes(lo->bytes_per_token, r.units), name(*lo),
                            format_bytes(hi->bytes_per_token, r.units), name(*hi)));
    std::vector<const CaseFacts*> all;
    for (const auto& c : cases) all.push_back(&c);
    const LargestSize big = largest_size(all);
    h.push_back(fmt::format("the largest asked: {} at {} tokens × batch {} = {}", name(*big.c), with_thousands(big.size.context), big.size.batch,
                            format_bytes(big.size.bytes_batch, r.units)));
    return h;
}

}  // namespace

std::vector<std::string> kvcalc_headline(const std::vector<CaseFacts>& cases, const KvcalcRequest& r) {
    if (cases.empty()) return {};
    const bool budget = r.kv_budget && r.engine == Engine::exact;
    std::vector<std::string> h;
    if (r.gpu) h = gpu_headline(cases, r);
    if (budget && h.size() > 2) h.resize(2);
    if (budget) {
        for (auto& line : budget_headline(cases, r, 3 - h.size())) h.push_back(std::move(line));
    }
    if (h.empty()) h = kv_size_headline(cases, r);
    return h;
}

}  // namespace kvlab
