#include "trace/trace_schema.hpp"

#include <map>
#include <stdexcept>

#include <fmt/format.h>

#include "kvlab/core/text.hpp"

namespace kvlab {

using json = nlohmann::json;

const char* const units_line =
    "flops and transcendentals: operations (a multiply-add = 2 FLOPs); bytes_* and kv_bytes_resident: bytes; "
    "wall_ns: nanoseconds; gflop_per_s: 1e9 FLOP/s; gb_per_s: 1e9 bytes/s; flop_per_byte: FLOP per byte moved; "
    "max_abs_dlogit: logit units; <op>.*: the same per op, summed over layers";

namespace {

double ratio(double num, double den) { return den > 0.0 ? num / den : 0.0; }
double seconds(const StepRecord& r) { return static_cast<double>(r.wall_ns) * 1e-9; }
OpCost total(const StepRecord& r) { return r.cost.total(); }

[[noreturn]] void bad(const std::string& why) { throw std::invalid_argument(why); }

// The columns, in file order. Derived ones (read = nullptr) are recomputed by the reader.
constexpr StepField step_table[] = {
    {"mode", FieldType::text, "", false, [](const StepRecord& r) -> json { return std::string(step_mode_name(r.mode)); },
     [](StepRecord& r, const json& v) {
         const auto mode = v.get<std::string>();
         if (mode == "cached") r.mode = StepMode::cached;
         else if (mode == "uncached") r.mode = StepMode::uncached;
         else bad(fmt::format("mode {}; expected cached or uncached", quote(mode, 20)));
     }},
    {"step", FieldType::integer, "", false, [](const StepRecord& r) -> json { return r.step; },
     [](StepRecord& r, const json& v) {
         r.step = v.get<std::int64_t>();
         if (r.step < 0) bad(fmt::format("step {}; expected 0 or more", r.step));
     }},
    {"phase", FieldType::text, "", false, [](const StepRecord& r) -> json { return r.step == 0 ? "prefill" : "decode"; },
     [](StepRecord& r, const json& v) {  // a check: the phase follows from the step
         const char* want = r.step == 0 ? "prefill" : "decode";
         if (v.get<std::string>() != want) bad(fmt::format("phase {} at step {}; expected {}", quote(v.get<std::string>(), 20), r.step, want));
     }},
    {"position", FieldType::integer, "position", false, [](const StepRecord& r) -> json { return r.position; },
     [](StepRecord& r, const json& v) { r.position = v.get<std::int64_t>(); }},
    {"n_tokens", FieldType::integer, "tokens", false, [](const StepRecord& r) -> json { return r.n_tokens; },
     [](StepRecord& r, const json& v) { r.n_tokens = v.get<std::int64_t>(); }},
    {"n_keys", FieldType::integer, "keys", false, [](const StepRecord& r) -> json { return r.n_keys; },
     [](StepRecord& r, const json& v) { r.n_keys = v.get<std::int64_t>(); }},
    {"flops", FieldType::count, "FLOP", false, [](const StepRecord& r) -> json { return total(r).flops; }, nullptr},
    {"flops_matmul", FieldType::count, "FLOP", false, [](const StepRecord& r) -> json { return r.cost.flops(OpCategory::matmul); }, nullptr},
    {"flops_attention", FieldType::count, "FLOP", false, [](const StepRecord& r) -> json { return r.cost.flops(OpCategory::attention); }, nullptr},
    {"flops_other", FieldType::count, "FLOP", false, [](const StepRecord& r) -> json { return r.cost.flops(OpCategory::other); }, nullptr},
    {"transcendentals", FieldType::count, "operations", false, [](const StepRecord& r) -> json { return total(r).transcendentals; }, nullptr},
    {"bytes_weights_read", FieldType::count, "bytes", false, [](const StepRecord& r) -> json { return total(r).bytes_weights_read; }, nullptr},
    {"bytes_act_read", FieldType::count, "bytes", false, [](const StepRecord& r) -> json { return total(r).bytes_act_read; }, nullptr},
    {"bytes_act_written", FieldType::count, "bytes", false, [](const StepRecord& r) -> json { return total(r).bytes_act_written; }, nullptr},
    {"bytes_kv_read", FieldType::count, "bytes", false, [](const StepRecord& r) -> json { return total(r).bytes_kv_read; }, nullptr},
    {"bytes_kv_written", FieldType::count, "bytes", false, [](const StepRecord& r) -> json { return total(r).bytes_kv_written; }, nullptr},
    {"bytes_total", FieldType::count, "bytes", false, [](const StepRecord& r) -> json { return total(r).bytes_total(); }, nullptr},
    {"kv_bytes_resident", FieldType::count, "bytes", false, [](const StepRecord& r) -> json { return r.kv_bytes_resident; },
     [](StepRecord& r, const json& v) { r.kv_bytes_resident = v.get<std::uint64_t>(); }},
    {"flop_per_byte", FieldType::real, "FLOP/byte", false,
     [](const StepRecord& r) -> json { return ratio(static_cast<double>(total(r).flops), static_cast<double>(total(r).bytes_total())); },
     nullptr},
    {"token", FieldType::integer, "token id", false, [](const StepRecord& r) -> json { return r.token; },
     [](StepRecord& r, const json& v) { r.token = static_cast<TokenId>(v.get<std::int64_t>()); }},
    {"max_abs_dlogit", FieldType::real_or_null, "logit units", false,
     [](const StepRecord& r) -> json { return r.max_abs_dlogit >= 0.0 ? json(r.max_abs_dlogit) : json(nullptr); },
     [](StepRecord& r, const json& v) { r.max_abs_dlogit = v.is_null() ? -1.0 : v.get<double>(); }},
    {"argmax_flip", FieldType::boolean, "", false, [](const StepRecord& r) -> json { return r.argmax_flip; },
     [](StepRecord& r, const json& v) { r.argmax_flip = v.get<bool>(); }},
    {"wall_ns", FieldType::integer, "nanoseconds", true, [](const StepRecord& r) -> json { return r.wall_ns; },
     [](StepRecord& r, const json& v) {
         r.wall_ns = v.get<std::int64_t>();
         if (r.wall_ns < 0) bad(fmt::format("wall_ns {}; expected 0 or more", r.wall_ns));
     }},
    {"gflop_per_s", FieldType::real, "1e9 FLOP/s", true,
     [](const StepRecord& r) -> json { return ratio(static_cast<double>(total(r).flops) * 1e-9, seconds(r)); }, nullptr},
    {"gb_per_s", FieldType::real, "1e9 bytes/s", true,
     [](const StepRecord& r) -> json { return ratio(static_cast<double>(total(r).bytes_total()) * 1e-9, seconds(r)); }, nullptr},
};

constexpr OpField op_table[] = {
    {"flops", "FLOP", &OpCost::flops, false},
    {"transcendentals", "operations", &OpCost::transcendentals, false},
    {"bytes_weights_read", "bytes", &OpCost::bytes_weights_read, false},
    {"bytes_act_read", "bytes", &OpCost::bytes_act_read, false},
    {"bytes_act_written", "bytes", &OpCost::bytes_act_written, false},
    {"bytes_kv_read", "bytes", &OpCost::bytes_kv_read, false},
    {"bytes_kv_written", "bytes", &OpCost::bytes_kv_written, false},
    {"wall_ns", "nanoseconds", nullptr, true},
};

}  // namespace

std::span<const StepField> step_fields() { return step_table; }
std::span<const OpField> op_fields() { return op_table; }

const char* field_type_name(FieldType t) {
    switch (t) {
        case FieldType::text: return "a string";
        case FieldType::boolean: return "a boolean";
        case FieldType::real: return "a number";
        case FieldType::real_or_null: return "a number or empty";
        case FieldType::integer: return "an integer";
        case FieldType::count: return "a non-negative integer";
    }
    return "a value";
}

std::vector<std::string> trace_op_fields(bool deterministic) {
    std::vector<std::string> fields;
    for (const OpField& f : op_table)
        if (!(deterministic && f.measured)) fields.emplace_back(f.name);
    return fields;
}

std::vector<std::string> trace_columns(bool deterministic) {
    std::vector<std::string> cols;
    for (const StepField& f : step_table)
        if (!(deterministic && f.measured)) cols.emplace_back(f.name);
    const auto fields = trace_op_fields(deterministic);
    for (int i = 0; i < n_ops; ++i)
        for (const auto& f : fields) cols.push_back(fmt::format("{}.{}", op_name(static_cast<Op>(i)), f));
    return cols;
}

FieldType column_type(std::string_view column) {
    static const std::map<std::string, FieldType, std::less<>> types = [] {
        std::map<std::string, FieldType, std::less<>> m;
        for (const StepField& f : step_table) m.emplace(f.name, f.type);
        for (int i = 0; i < n_ops; ++i)
            for (const OpField& f : op_table)
                m.emplace(fmt::format("{}.{}", op_name(static_cast<Op>(i)), f.name), f.member ? FieldType::count : FieldType::integer);
        return m;
    }();
    const auto it = types.find(column);
    return it == types.end() ? FieldType::count : it->second;
}

json trace_record_json(const StepRecord& r, bool deterministic) {
    json j = json::object();
    for (const StepField& f : step_table)
        if (!(deterministic && f.measured)) j[std::string(f.name)] = f.write(r);
    for (int i = 0; i < n_ops; ++i) {
        const Op op = static_cast<Op>(i);
        const OpCost& c = r.cost.at(op);
        const auto prefix = std::string(op_name(op)) + ".";
        for (const OpField& f : op_table) {
            if (deterministic && f.measured) continue;
            if (f.member) j[prefix + std::string(f.name)] = c.*f.member;
            else j[prefix + std::string(f.name)] = r.cost.wall_ns_of(op);
        }
    }
    return j;
}

StepRecord record_from_row(const json& row, bool deterministic) {
    StepRecord r;
    for (const StepField& f : step_table)
        if (f.read && !(deterministic && f.measured)) f.read(r, row.at(std::string(f.name)));
    for (int i = 0; i < n_ops; ++i) {
        const Op op = static_cast<Op>(i);
        const std::string prefix = std::string(op_name(op)) + ".";
        OpCost c;
        for (const OpField& f : op_table) {
            if (deterministic && f.measured) continue;
            const json& v = row.at(prefix + std::string(f.name));
            if (f.member) c.*f.member = v.get<std::uint64_t>();
            else r.cost.wall_ns[static_cast<std::size_t>(i)] = v.get<std::int64_t>();
        }
        r.cost.add(op, c);
    }
    // the step's totals must be the sums of its ops, and its rates what they give: a hand-edited or
    // corrupted file is caught here
    for (const StepField& f : step_table) {
        if (f.read || (deterministic && f.measured)) continue;
        if (f.type == FieldType::count) {
            const auto stored = row.at(std::string(f.name)).get<std::uint64_t>(), sum = f.write(r).get<std::uint64_t>();
            if (stored != sum)
                bad(fmt::format("{} is {} but its ops sum to {}; the file was edited or corrupted", f.name, stored, sum));
        } else if (f.type == FieldType::real) {
            const double stored = row.at(std::string(f.name)).get<double>(), derived = f.write(r).get<double>();
            if (std::abs(stored - derived) > 1e-9 * std::max(1.0, std::abs(derived)))
                bad(fmt::format("{} is {} but its counts give {}; the file was edited or corrupted", f.name, stored, derived));
        }
    }
    return r;
}

}  // namespace kvlab
