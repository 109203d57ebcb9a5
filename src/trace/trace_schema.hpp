// The trace schema: every column of a step record, once — its name, type, and how it is taken
// from (and put back into) a StepRecord. The CSV and JSON Lines writers and readers and the Perfetto
// writer loop over these two tables; adding a column is adding a row. docs/trace-format.md describes it.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvlab/sim/simulator.hpp"

namespace kvlab {

// counts are unsigned (FLOPs, bytes), integers signed (steps, ids, ns)
enum class FieldType { text, boolean, real, real_or_null, integer, count };
const char* field_type_name(FieldType type);  // "a non-negative integer", ... (for error messages)

// A step column. `read` stores the file's value into the record, or checks it (phase), throwing
// std::invalid_argument with the reason; null for derived columns (totals, ratios), which the reader
// recomputes from the stored ones: a derived count that differs means the file was edited.
struct StepField {
    std::string_view name;
    FieldType type;
    std::string_view unit;  // "bytes", "FLOP", ...; empty for labels (docs/trace-format.md's table, tested)
    bool measured;  // wall time and rates: absent from --deterministic traces
    nlohmann::json (*write)(const StepRecord& record);
    void (*read)(StepRecord& record, const nlohmann::json& value);
};

// A per-op column "<op>.<name>": an OpCost count, or the op's measured wall time (member null).
struct OpField {
    std::string_view name;
    std::string_view unit;
    std::uint64_t OpCost::*member;
    bool measured;
};

std::span<const StepField> step_fields();
std::span<const OpField> op_fields();
// The units of the columns summed up in one line (the CSV "# units:" line and the JSON Lines header's "units").
extern const char* const units_line;

// Column names in order: the step columns, then "<op>.<field>" per op. `deterministic` drops the
// measured ones.
std::vector<std::string> trace_columns(bool deterministic);
// The per-op field names, in column order.
std::vector<std::string> trace_op_fields(bool deterministic);
// The type of any column name of the schema ("<op>.wall_ns" included); count for unknown ones.
FieldType column_type(std::string_view column);
// One record as a flat JSON object keyed by trace_columns (max_abs_dlogit null when not compared).
nlohmann::json trace_record_json(const StepRecord& record, bool deterministic);
// The record a row of the file describes (every column of trace_columns present and of its type):
// stored columns read, derived counts checked against the ops' sums. Throws std::invalid_argument.
StepRecord record_from_row(const nlohmann::json& row, bool deterministic);

}  // namespace kvlab
