#include "plan/msgpack_codec.h"

#include <bit>
#include <cmath>
#include <limits>
#include <set>

namespace sluice {
namespace {

using nlohmann::json;

bool Fits(const uint8_t* at, const uint8_t* end, size_t n) {
  return at <= end && static_cast<size_t>(end - at) >= n;
}

// Whether every string (keys included) in `j` is well-formed UTF-8.
bool AllUtf8(const json& j) {
  if (j.is_string()) return ValidUtf8(j.get_ref<const std::string&>());
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!ValidUtf8(it.key()) || !AllUtf8(it.value())) return false;
    }
  }
  if (j.is_array()) {
    for (const json& v : j) {
      if (!AllUtf8(v)) return false;
    }
  }
  return true;
}

}  // namespace

void MsgpackWriter::Map(size_t entries) { Header(entries, 0x80, 0xde, 0xdf, 16); }

void MsgpackWriter::Array(size_t size) { Header(size, 0x90, 0xdc, 0xdd, 16); }

void MsgpackWriter::Str(std::string_view s) {
  if (s.size() < 32) {
    out_.push_back(static_cast<uint8_t>(0xa0 | s.size()));
  } else if (s.size() <= 0xff) {
    out_.push_back(0xd9);
    out_.push_back(static_cast<uint8_t>(s.size()));
  } else {
    Header(s.size(), 0, 0xda, 0xdb, 0);
  }
  out_.insert(out_.end(), s.begin(), s.end());
}

void MsgpackWriter::Int(int64_t v) {
  if (v >= -32 && v < 128) {  // positive and negative fixint
    out_.push_back(static_cast<uint8_t>(v));
  } else if (v >= 0) {
    const uint64_t u = static_cast<uint64_t>(v);
    if (u <= 0xff) {
      Big(0xcc, u, 1);
    } else if (u <= 0xffff) {
      Big(0xcd, u, 2);
    } else if (u <= 0xffffffffu) {
      Big(0xce, u, 4);
    } else {
      Big(0xcf, u, 8);
    }
  } else if (v >= -128) {
    Big(0xd0, static_cast<uint64_t>(v), 1);
  } else if (v >= -32768) {
    Big(0xd1, static_cast<uint64_t>(v), 2);
  } else if (v >= std::numeric_limits<int32_t>::min()) {
    Big(0xd2, static_cast<uint64_t>(v), 4);
  } else {
    Big(0xd3, static_cast<uint64_t>(v), 8);
  }
}

void MsgpackWriter::Bool(bool b) { out_.push_back(b ? 0xc3 : 0xc2); }

void MsgpackWriter::Ints(const std::vector<int64_t>& v) {
  Array(v.size());
  for (int64_t x : v) Int(x);
}

void MsgpackWriter::Json(const json& j) {
  const std::vector<uint8_t> bytes = json::to_msgpack(j);
  out_.insert(out_.end(), bytes.begin(), bytes.end());
}

void MsgpackWriter::Big(uint8_t tag, uint64_t v, int bytes) {
  out_.push_back(tag);
  for (int b = bytes - 1; b >= 0; --b) out_.push_back(static_cast<uint8_t>(v >> (8 * b)));
}

void MsgpackWriter::Header(size_t n, uint8_t fix, uint8_t tag16, uint8_t tag32, size_t fix_limit) {
  if (n < fix_limit) {
    out_.push_back(static_cast<uint8_t>(fix | n));
  } else if (n <= 0xffff) {
    Big(tag16, n, 2);
  } else {
    Big(tag32, n, 4);
  }
}

bool MsgpackReader::Container(bool map, size_t* n) {
  if (p_ >= end_) return false;
  const uint8_t t = *p_;
  uint64_t v = 0;
  size_t head = 1;
  if ((t & 0xf0) == (map ? 0x80 : 0x90)) {
    v = t & 0x0f;
  } else if (t == (map ? 0xde : 0xdc) && Read(p_ + 1, 2, &v)) {
    head = 3;
  } else if (t == (map ? 0xdf : 0xdd) && Read(p_ + 1, 4, &v)) {
    head = 5;
  } else {
    return false;
  }
  // Every element takes at least one byte.
  if (v > static_cast<uint64_t>(end_ - p_) - head) return false;
  *n = v;
  p_ += head;
  return true;
}

bool MsgpackReader::Str(std::string_view* s) {
  if (p_ >= end_) return false;
  const uint8_t t = *p_;
  uint64_t len = 0;
  size_t head = 1;
  if ((t & 0xe0) == 0xa0) {
    len = t & 0x1f;
  } else if (t == 0xd9 && Read(p_ + 1, 1, &len)) {
    head = 2;
  } else if (t == 0xda && Read(p_ + 1, 2, &len)) {
    head = 3;
  } else if (t == 0xdb && Read(p_ + 1, 4, &len)) {
    head = 5;
  } else {
    return false;
  }
  if (!Fits(p_, end_, head + len)) return false;
  *s = std::string_view(reinterpret_cast<const char*>(p_ + head), len);
  p_ += head + len;
  return true;
}

bool MsgpackReader::Int(int64_t* out) {
  if (p_ >= end_) return false;
  const uint8_t t = *p_;
  if (t < 0x80 || t >= 0xe0) {  // positive and negative fixint
    *out = static_cast<int8_t>(t);
    ++p_;
    return true;
  }
  const int width = t == 0xcc || t == 0xd0                ? 1
                    : t == 0xcd || t == 0xd1              ? 2
                    : t == 0xce || t == 0xd2 || t == 0xca ? 4
                    : t == 0xcf || t == 0xd3 || t == 0xcb ? 8
                                                          : 0;
  uint64_t v = 0;
  if (width == 0 || !Read(p_ + 1, width, &v)) return false;
  if (t == 0xca || t == 0xcb) {
    const double d = t == 0xca ? static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(v)))
                               : std::bit_cast<double>(v);
    if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) >= 9e15) return false;
    *out = static_cast<int64_t>(d);
  } else if (t >= 0xd0) {  // signed: sign-extend from `width` bytes
    const int shift = 64 - 8 * width;
    *out = static_cast<int64_t>(v << shift) >> shift;
  } else {
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(v);
  }
  p_ += 1 + width;
  return true;
}

bool MsgpackReader::Bool(bool* b) {
  if (p_ >= end_ || (*p_ != 0xc2 && *p_ != 0xc3)) return false;
  *b = *p_++ == 0xc3;
  return true;
}

bool MsgpackReader::Json(json* out) {
  duplicate_key_.clear();
  const uint8_t* begin = p_;
  if (!Skip(0)) {
    p_ = begin;
    return false;
  }
  *out = json::from_msgpack(begin, p_, /*strict=*/true, /*allow_exceptions=*/false);
  return !out->is_discarded() && AllUtf8(*out);
}

bool MsgpackReader::Read(const uint8_t* at, int bytes, uint64_t* v) const {
  if (!Fits(at, end_, bytes)) return false;
  *v = 0;
  for (int b = 0; b < bytes; ++b) *v = (*v << 8) | at[b];
  return true;
}

bool MsgpackReader::Skip(int depth) {
  if (depth > kMaxDepth || p_ >= end_) return false;
  size_t n = 0;
  const bool map = Container(true, &n);
  if (map) {
    n *= 2;  // keys and values
  } else if (!Container(false, &n)) {
    if (*p_ == 0xc0) {  // nil
      ++p_;
      return true;
    }
    if (*p_ == 0xca || *p_ == 0xcb) {  // floats
      const size_t w = *p_ == 0xca ? 5 : 9;
      if (!Fits(p_, end_, w)) return false;
      p_ += w;
      return true;
    }
    std::string_view s;
    int64_t i = 0;
    bool b = false;
    return Str(&s) || Int(&i) || Bool(&b);
  }
  std::set<std::string_view> keys;
  for (size_t k = 0; k < n; ++k) {
    std::string_view key;
    const uint8_t* at = p_;
    if (map && k % 2 == 0 && Str(&key)) {
      if (!keys.insert(key).second) {
        duplicate_key_ = std::string(key);
        return false;
      }
      continue;
    }
    p_ = at;
    if (!Skip(depth + 1)) return false;
  }
  return true;
}

bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if (c >= 0xc2 && c <= 0xdf) {
      n = 1;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 2;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      const uint8_t cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (n == 3 && (cp < 0x10000 || cp > 0x10ffff))) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

}  // namespace sluice
