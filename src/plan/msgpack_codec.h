// MsgpackWriter and MsgpackReader: the part of MessagePack (https://msgpack.org, the spec's
// "format" section) that JSON documents use: maps, arrays, UTF-8 strings, integers, floats,
// booleans and nil. The plan's MessagePack form (plan_msgpack.cc) writes and reads through them
// directly, without a JSON tree.
//
// The writer picks the shortest encoding of each value. The reader accepts every encoding the
// spec allows for these types; each accessor returns false, consuming nothing, when the next
// value has another type or the input ends early, so that no input can read out of bounds; a
// container's claimed size is checked against the bytes left before anyone allocates for it.
//
// Thread safety: one writer or reader per thread; the buffers must outlive them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sluice {

class MsgpackWriter {
 public:
  // Appends to `out`, which must outlive the writer.
  explicit MsgpackWriter(std::vector<uint8_t>* out) : out_(*out) {}

  void Map(size_t entries);  // followed by `entries` key-value pairs
  void Array(size_t size);   // followed by `size` values
  void Str(std::string_view s);
  void Int(int64_t v);
  void Bool(bool b);
  void Ints(const std::vector<int64_t>& v);  // an array of integers
  void Json(const nlohmann::json& j);        // any JSON value (nlohmann's encoding)

 private:
  void Big(uint8_t tag, uint64_t v, int bytes);
  void Header(size_t n, uint8_t fix, uint8_t tag16, uint8_t tag32, size_t fix_limit);
  std::vector<uint8_t>& out_;
};

class MsgpackReader {
 public:
  // Nesting accepted by Skip and Json.
  static constexpr int kMaxDepth = 64;

  explicit MsgpackReader(std::span<const uint8_t> bytes)
      : p_(bytes.data()), end_(bytes.data() + bytes.size()) {}

  bool at_end() const { return p_ == end_; }
  // A map (`map`) or array header with its size.
  bool Container(bool map, size_t* n);
  // A string, as a view into the input (not checked for UTF-8).
  bool Str(std::string_view* s);
  // Any integer encoding, or a float holding a whole number of magnitude below 9e15 (JSON's
  // integers are whole numbers however they are written).
  bool Int(int64_t* out);
  bool Bool(bool* b);
  // The next value as JSON (nlohmann's decoder), all of its strings well-formed UTF-8, no map
  // with a key given twice (nlohmann would keep the last silently; see duplicate_key()).
  bool Json(nlohmann::json* out);
  // After Json() failed on a map that gives a key twice: that key; else "".
  const std::string& duplicate_key() const { return duplicate_key_; }

 private:
  bool Read(const uint8_t* at, int bytes, uint64_t* v) const;
  bool Skip(int depth);

  const uint8_t* p_;
  const uint8_t* end_;
  std::string duplicate_key_;
};

// Whether `s` is well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points above
// U+10FFFF), as JSON text must be.
bool ValidUtf8(std::string_view s);

}  // namespace sluice
