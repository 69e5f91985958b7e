// A minimal streaming JSON writer: enough for nanhunt's reports, with
// correct string escaping and non-finite numbers written as null.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace nanhunt {

class JsonWriter {
 public:
  JsonWriter& BeginObject() { return Open('{'); }
  JsonWriter& EndObject() { return Close('}'); }
  JsonWriter& BeginArray() { return Open('['); }
  JsonWriter& EndArray() { return Close(']'); }

  JsonWriter& Key(absl::string_view key) {
    Separate();
    Quote(key);
    out_ += ':';
    after_key_ = true;
    return *this;
  }
  JsonWriter& String(absl::string_view v) {
    Separate();
    Quote(v);
    return *this;
  }
  JsonWriter& Int(int64_t v) {
    Separate();
    absl::StrAppend(&out_, v);
    return *this;
  }
  JsonWriter& Number(double v) {
    Separate();
    if (std::isfinite(v)) {
      absl::StrAppendFormat(&out_, "%.17g", v);
    } else {
      out_ += "null";
    }
    return *this;
  }
  JsonWriter& Bool(bool v) {
    Separate();
    out_ += v ? "true" : "false";
    return *this;
  }
  JsonWriter& Null() {
    Separate();
    out_ += "null";
    return *this;
  }

  const std::string& str() const { return out_; }

 private:
  JsonWriter& Open(char c) {
    Separate();
    out_ += c;
    first_ = true;
    return *this;
  }
  JsonWriter& Close(char c) {
    out_ += c;
    first_ = false;
    return *this;
  }
  void Separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_ && !out_.empty()) out_ += ',';
    first_ = false;
  }
  void Quote(absl::string_view s) {
    out_ += '"';
    for (unsigned char c : s) {
      switch (c) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\n': out_ += "\\n"; break;
        case '\r': out_ += "\\r"; break;
        case '\t': out_ += "\\t"; break;
        default:
          if (c < 0x20) {
            absl::StrAppendFormat(&out_, "\\u%04x", c);
          } else {
            out_ += static_cast<char>(c);
          }
      }
    }
    out_ += '"';
  }

  std::string out_;
  bool first_ = true;
  bool after_key_ = false;
};

}  // namespace nanhunt
