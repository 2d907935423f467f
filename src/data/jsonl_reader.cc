// The JSON Lines length reader: nlohmann's SAX parser on each line, reading only the configured
// fields without building a DOM. On the 30,000-line mixture it reads in ~18 ms; a DOM per line
// took ~22 ms, and SAX events also give each field's type for the messages.
#include <fmt/core.h>

#include <array>
#include <cmath>
#include <nlohmann/json.hpp>

#include "data/reader_util.h"

namespace sluice::data_internal {
namespace {

class JsonLineHandler {
 public:
  using number_integer_t = nlohmann::json::number_integer_t;
  using number_unsigned_t = nlohmann::json::number_unsigned_t;
  using number_float_t = nlohmann::json::number_float_t;
  using string_t = nlohmann::json::string_t;
  using binary_t = nlohmann::json::binary_t;

  JsonLineHandler(const ReaderOptions& options, std::string_view source)
      : options_(options), source_(source) {}

  // Prepares for the next line.
  void Reset(int64_t line) {
    line_ = line;
    depth_ = 0;
    pending_ = Slot::kNone;
    seen_ = {false, false, false};
    input_ = target_ = 0;
    task_.clear();
    status_ = Status::Ok();
  }

  const Status& status() const { return status_; }
  // Whether the target / task key appeared on any line so far (even with a null value).
  bool target_ever_present() const { return ever_present_[1]; }
  bool task_ever_present() const { return ever_present_[2]; }
  bool has_input() const { return seen_[0]; }
  bool has_task() const { return seen_[2] && !task_.empty(); }
  int64_t input() const { return input_; }
  int64_t target() const { return target_; }
  const std::string& task() const { return task_; }

  bool null() {
    if (depth_ == 0) return TopLevel("null");
    if (!Watched()) return true;
    if (pending_ == Slot::kInput) return WrongType("null");
    seen_[static_cast<int>(pending_)] = false;  // a null target or task counts as absent
    pending_ = Slot::kNone;
    return true;
  }
  bool boolean(bool b) {
    if (depth_ == 0) return TopLevel(b ? "true" : "false");
    return Watched() ? WrongType(b ? "true" : "false") : true;
  }
  bool number_integer(number_integer_t v) {
    if (depth_ == 0) return TopLevel("a number");
    if (!Watched()) return true;
    if (pending_ == Slot::kTask) return WrongType(fmt::format("the number {}", v));
    return Length(v);
  }
  bool number_unsigned(number_unsigned_t v) {
    if (depth_ == 0) return TopLevel("a number");
    if (!Watched()) return true;
    if (pending_ == Slot::kTask) return WrongType(fmt::format("the number {}", v));
    if (v > static_cast<number_unsigned_t>(kMaxLength)) {
      return Fail(fmt::format("a length must be at most {}, got {}", kMaxLength, v));
    }
    return Length(static_cast<int64_t>(v));
  }
  // A whole number written with a fraction or exponent (12.0, 1e3) is accepted, as pandas writes
  // integer columns with missing values that way.
  bool number_float(number_float_t v, const string_t& text) {
    if (depth_ == 0) return TopLevel("a number");
    if (!Watched()) return true;
    if (pending_ == Slot::kTask || !std::isfinite(v) || std::floor(v) != v) {
      return WrongType(fmt::format("the number {}", Quote(text)));
    }
    if (v > static_cast<double>(kMaxLength)) {
      return Fail(fmt::format("a length must be at most {}, got {}", kMaxLength, Quote(text)));
    }
    if (v < 0) return Fail(fmt::format("a length must be >= 0, got {}", Quote(text)));
    return Length(static_cast<int64_t>(v));
  }
  bool string(string_t& s) {
    if (depth_ == 0) return TopLevel("a string");
    if (!Watched()) return true;
    if (pending_ != Slot::kTask) return WrongType(fmt::format("the string {}", Quote(s)));
    if (s.empty()) return Fail("a task name must not be empty");
    task_.assign(s);
    pending_ = Slot::kNone;
    return true;
  }
  bool binary(binary_t&) { return depth_ == 0 ? TopLevel("binary data") : true; }
  bool start_object(std::size_t) {
    if (Watched()) return WrongType("an object");
    ++depth_;
    return true;
  }
  bool end_object() {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) {
    if (depth_ == 0) return TopLevel("an array");
    if (Watched()) return WrongType("an array");
    ++depth_;
    return true;
  }
  bool end_array() {
    --depth_;
    return true;
  }
  bool key(string_t& k) {
    if (depth_ != 1) return true;
    pending_ = Slot::kNone;
    if (k == options_.input_field) {
      pending_ = Slot::kInput;
    } else if (!options_.target_field.empty() && k == options_.target_field) {
      pending_ = Slot::kTarget;
    } else if (!options_.task_field.empty() && k == options_.task_field) {
      pending_ = Slot::kTask;
    }
    if (pending_ == Slot::kNone) return true;
    pending_key_.assign(k);
    ever_present_[static_cast<int>(pending_)] = true;
    bool& seen = seen_[static_cast<int>(pending_)];
    if (seen) return Fail("duplicate field");
    seen = true;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::json::exception& e) {
    // nlohmann says "... parse error at line 1, column 7: <what>"; keep <what>.
    std::string what = e.what();
    const size_t colon = what.find(": ", what.find("column"));
    if (colon != std::string::npos) what = what.substr(colon + 2);
    if (what.size() > 160) what = what.substr(0, 157) + "...";  // "last read: <a long token>"
    status_ = InvalidArgumentError(
        fmt::format("{}:{}:{}: not valid JSON ({})", source_, line_, position, what));
    return false;
  }

 private:
  enum class Slot { kInput = 0, kTarget = 1, kTask = 2, kNone = 3 };

  // True while the next value belongs to a field this reader reads.
  bool Watched() const { return depth_ == 1 && pending_ != Slot::kNone; }
  bool TopLevel(std::string_view got) {
    status_ = InvalidArgumentError(
        fmt::format("{}:{}: expected a JSON object like {{\"{}\": 512}}, got {}", source_, line_,
                    options_.input_field, got));
    return false;
  }
  bool WrongType(std::string_view got) {
    return Fail(fmt::format("expected {}, got {}",
                            pending_ == Slot::kTask ? "a string" : "a non-negative integer", got));
  }
  bool Length(int64_t v) {
    if (v < 0) return Fail(fmt::format("a length must be >= 0, got {}", v));
    (pending_ == Slot::kInput ? input_ : target_) = v;
    pending_ = Slot::kNone;
    return true;
  }
  bool Fail(std::string_view problem) {
    status_ = InvalidArgumentError(
        fmt::format("{}:{}: field '{}': {}", source_, line_, pending_key_, problem));
    return false;
  }

  const ReaderOptions& options_;
  std::string_view source_;
  int64_t line_ = 0;
  int depth_ = 0;
  Slot pending_ = Slot::kNone;
  std::string pending_key_;
  std::array<bool, 3> seen_ = {false, false, false};
  std::array<bool, 3> ever_present_ = {false, false, false};
  int64_t input_ = 0;
  int64_t target_ = 0;
  std::string task_;
  Status status_;
};

}  // namespace

StatusOr<Dataset> ParseJsonLines(std::string_view text, const ReaderOptions& options,
                                 std::string_view source) {
  Dataset ds{std::string(source)};
  ds.Reserve(text.size() / 48);
  JsonLineHandler handler(options, source);
  TaskId default_task = -1;
  Status status = ForEachLine(text, [&](std::string_view line, int64_t line_no) -> Status {
    handler.Reset(line_no);
    const bool ok = nlohmann::json::sax_parse(line.begin(), line.end(), &handler);
    if (!handler.status().ok()) return handler.status();
    if (!ok) return InternalError(fmt::format("{}:{}: JSON parser stopped", source, line_no));
    if (!handler.has_input()) {
      return InvalidArgumentError(fmt::format(
          "{}:{}: missing field '{}' (the input length; rename the field, or name it with "
          "`sluice data stats --input-field`)",
          source,
          line_no, options.input_field));
    }
    SLUICE_RETURN_IF_ERROR(CheckNotEmpty(handler.input(), handler.target(), source, line_no));
    TaskId task;
    if (handler.has_task()) {
      task = ds.InternTask(handler.task());
    } else {
      if (default_task < 0) default_task = ds.InternTask(options.default_task);
      task = default_task;
    }
    ds.Add(handler.input(), handler.target(), task);
    return Status::Ok();
  });
  SLUICE_RETURN_IF_ERROR(status);
  if (ds.empty()) return NoSamples(source);
  if (IsCustom(options.target_field, kDefaultTargetField) && !handler.target_ever_present()) {
    return InvalidArgumentError(
        fmt::format("{}: field '{}' (the configured target field) is on no line", source,
                    options.target_field));
  }
  if (IsCustom(options.task_field, kDefaultTaskField) && !handler.task_ever_present()) {
    return InvalidArgumentError(fmt::format(
        "{}: field '{}' (the configured task field) is on no line", source, options.task_field));
  }
  return ds;
}

}  // namespace sluice::data_internal
