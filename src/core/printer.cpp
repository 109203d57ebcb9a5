#include "kvlab/core/printer.hpp"

#include <algorithm>
#include <cmath>
#include <ostream>

#include <fmt/format.h>

#include "core/json_input.hpp"
#include "kvlab/core/text.hpp"
#include "kvlab/core/error.hpp"

namespace kvlab {
namespace {

std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n\r") == std::string::npos) return s;  // RFC 4180: a CR is quoted too
    std::string out = "\"";
    for (char c : s) {
        if (c == '"') out += '"';
        out += c;
    }
    return out + "\"";
}

std::string csv_value(const nlohmann::json& v) {
    if (v.is_string()) return csv_field(v.get<std::string>());
    if (v.is_null()) return "";
    return json_dump(v);
}

std::string md_escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '|') out += '\\';
        out += c;
    }
    return out;
}

// Display width in code points, so "×" or "µ" does not break alignment.
std::size_t display_width(const std::string& s) {
    std::size_t n = 0;
    for (unsigned char c : s)
        if ((c & 0xC0) != 0x80) ++n;
    return n;
}

std::string pad(const std::string& s, std::size_t width, bool right) {
    const auto w = display_width(s);
    if (w >= width) return s;
    const std::string fill(width - w, ' ');
    return right ? fill + s : s + fill;
}

void print_table(std::ostream& out, const Table& t) {
    if (!t.title.empty()) out << printable(t.title) << "\n";  // titles may hold names from files
    std::vector<std::size_t> width(t.columns.size());
    for (std::size_t c = 0; c < t.columns.size(); ++c) {
        width[c] = display_width(t.columns[c].header);
        for (const auto& row : t.rows) width[c] = std::max(width[c], display_width(printable(row[c].text)));
    }
    std::string line;
    for (std::size_t c = 0; c < t.columns.size(); ++c) line += (c ? "  " : "") + pad(t.columns[c].header, width[c], t.columns[c].align_right);
    out << line << "\n";
    line.clear();
    for (std::size_t c = 0; c < t.columns.size(); ++c) line += (c ? "  " : "") + std::string(width[c], '-');
    out << line << "\n";
    for (const auto& row : t.rows) {
        line.clear();
        // cells may hold names from files (a config's _name_or_path): control bytes escaped
        for (std::size_t c = 0; c < t.columns.size(); ++c) line += (c ? "  " : "") + pad(printable(row[c].text), width[c], t.columns[c].align_right);
        out << line << "\n";
    }
    for (const auto& n : t.notes) out << "  " << printable(n) << "\n";  // notes may quote names from files
}

void print_markdown(std::ostream& out, const Table& t) {
    if (!t.title.empty()) out << "### " << md_escape(printable(t.title)) << "\n\n";
    out << "|";
    for (const auto& c : t.columns) out << " " << md_escape(c.header) << " |";
    out << "\n|";
    for (const auto& c : t.columns) out << (c.align_right ? " ---: |" : " --- |");
    out << "\n";
    for (const auto& row : t.rows) {
        out << "|";
        for (const auto& cell : row) out << " " << md_escape(printable(cell.text)) << " |";
        out << "\n";
    }
    if (!t.notes.empty()) {
        out << "\n";
        for (const auto& n : t.notes) out << "- " << md_escape(printable(n)) << "\n";
    }
}

nlohmann::json table_json(const Table& t) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& row : t.rows) {
        nlohmann::json r = nlohmann::json::object();
        for (std::size_t c = 0; c < t.columns.size(); ++c) r[t.columns[c].key] = row[c].value;
        rows.push_back(std::move(r));
    }
    return {{"table", t.title}, {"rows", rows}, {"notes", t.notes}};
}

// A report-wide note that warns: it goes to stderr in every format (table and markdown leave it off stdout,
// JSON keeps it in "notes" too), so a warning is seen even when stdout goes to a file or a pipe.
bool is_warning(const std::string& note) { return note.rfind("warning:", 0) == 0; }

bool has_other_notes(const Report& report) {
    return std::any_of(report.notes.begin(), report.notes.end(), [](const std::string& n) { return !is_warning(n); });
}

}  // namespace

Cell text_cell(std::string text) { return {text, text}; }
Cell int_cell(std::int64_t value) { return {fmt::format("{}", value), value}; }
Cell uint_cell(std::uint64_t value) { return {fmt::format("{}", value), value}; }
Cell bytes_cell(std::uint64_t bytes, UnitSystem units) { return {format_bytes(bytes, units), bytes}; }
Cell real_cell(double value, int decimals) { return {fmt::format("{:.{}f}", value, decimals), value}; }
Cell ratio_cell(double value) { return {fmt::format("{:.2f}x", value), value}; }

Cell count_cell(std::uint64_t value, const char* unit) {
    static const char* prefixes[] = {"", "k", "M", "G", "T", "P", "E"};
    double v = static_cast<double>(value);
    int i = 0;
    while (v >= 999.995 && i < 6) {  // as format_bytes: 999,999,999 is 1.00 G, not 1000.00 M
        v /= 1000.0;
        ++i;
    }
    return {i == 0 ? fmt::format("{} {}", value, unit) : fmt::format("{:.2f} {}{}", v, prefixes[i], unit), value};
}

Cell percent_cell(double percent) {
    // the fewest decimals, from 1, that do not round a share strictly between 0 and 100 to either end
    auto rounds_to_end = [&](int decimals) {
        const double scale = std::pow(10.0, decimals), r = std::round(percent * scale) / scale;
        return r <= 0.0 || r >= 100.0;
    };
    int decimals = 1;
    if (percent > 0.0 && percent < 100.0) {
        while (decimals < 6 && rounds_to_end(decimals)) ++decimals;
        if (rounds_to_end(decimals)) return {percent < 50.0 ? "<0.000001%" : ">99.999999%", percent};
    }
    return {fmt::format("{:.{}f}%", percent, decimals), percent};
}

Cell change_percent_cell(double percent) {
    int decimals = 3;
    while (decimals < 6 && percent != 0.0 && std::round(std::abs(percent) * std::pow(10.0, decimals)) == 0.0) ++decimals;
    return {fmt::format("{:+.{}f}%", percent, decimals), percent};
}

void print_report(std::ostream& out, const Report& report, Format format, std::ostream& notes) {
    switch (format) {
    case Format::table:
        for (const auto& h : report.headline) out << printable(h) << "\n";
        if (!report.headline.empty()) out << "\n";
        for (std::size_t i = 0; i < report.tables.size(); ++i) {
            if (i) out << "\n";
            print_table(out, report.tables[i]);
        }
        if (has_other_notes(report)) out << "\n";
        for (const auto& n : report.notes)
            if (!is_warning(n)) out << printable(n) << "\n";
        break;
    case Format::markdown:
        for (const auto& h : report.headline) out << "**" << md_escape(printable(h)) << "**\n\n";
        for (std::size_t i = 0; i < report.tables.size(); ++i) {
            if (i) out << "\n";
            print_markdown(out, report.tables[i]);
        }
        if (has_other_notes(report)) out << "\n";
        for (const auto& n : report.notes)
            if (!is_warning(n)) out << "- " << md_escape(printable(n)) << "\n";
        break;
    case Format::csv:
        for (std::size_t i = 0; i < report.tables.size(); ++i) {
            const auto& t = report.tables[i];
            if (report.tables.size() > 1) out << (i ? "\n" : "") << "# " << printable(t.title) << "\n";
            for (std::size_t c = 0; c < t.columns.size(); ++c) out << (c ? "," : "") << csv_field(t.columns[c].key);
            out << "\n";
            for (const auto& row : t.rows) {
                for (std::size_t c = 0; c < row.size(); ++c) out << (c ? "," : "") << csv_value(row[c].value);
                out << "\n";
            }
        }
        break;
    case Format::json: {
        // "schema" names this layout (inputs, tables of columns and rows, notes) and changes when it does
        nlohmann::json j = {{"schema", report_json_schema}, {"kvlab_version", KVLAB_VERSION}, {"inputs", report.inputs},
                            {"tables", nlohmann::json::array()}, {"notes", report.notes}};
        for (const auto& t : report.tables) j["tables"].push_back(table_json(t));
        if (!report.headline.empty()) j["headline"] = report.headline;
        out << json_dump(j, 2) << "\n";
        break;
    }
    }
    // every format: the warnings on stderr too, where a reader of stdout through a pipe or file still sees them
    for (const auto& n : report.notes)
        if (is_warning(n)) notes << printable(n) << "\n";
}

}  // namespace kvlab
