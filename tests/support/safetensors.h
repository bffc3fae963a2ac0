// A minimal JSON parser and safetensors reader for the golden files (tests/data/golden).
//
// safetensors: 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}
// then the raw tensor bytes; offsets are relative to the end of the header.
#pragma once

#include <cctype>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvt {

struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<Json> arr;
  std::vector<std::pair<std::string, Json>> obj;  // in file order

  const Json* Find(const std::string& key) const {
    for (const auto& kv : obj) {
      if (kv.first == key) return &kv.second;
    }
    return nullptr;
  }
  const Json& At(const std::string& key) const {
    const Json* j = Find(key);
    if (j == nullptr) throw std::runtime_error("JSON key '" + key + "' missing");
    return *j;
  }
  int64_t Int() const {
    if (kind != kNumber) throw std::runtime_error("JSON value is not a number");
    return static_cast<int64_t>(num);
  }
  const std::string& Str() const {
    if (kind != kString) throw std::runtime_error("JSON value is not a string");
    return str;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}

  Json Parse() {
    Json j = Value();
    Ws();
    if (i_ != s_.size()) Fail("trailing characters");
    return j;
  }

 private:
  [[noreturn]] void Fail(const std::string& what) {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(i_));
  }
  void Ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool Eat(char c) {
    Ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void Expect(char c) {
    if (!Eat(c)) Fail(std::string("expected '") + c + "'");
  }
  std::string String() {
    Expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c == '\\') {
        if (i_ >= s_.size()) Fail("bad escape");
        const char e = s_[i_++];
        switch (e) {
          case 'n':
            out += '\n';
            break;
          case 't':
            out += '\t';
            break;
          case 'r':
            out += '\r';
            break;
          case 'b':
            out += '\b';
            break;
          case 'f':
            out += '\f';
            break;
          case 'u': {
            if (i_ + 4 > s_.size()) Fail("bad \\u escape");
            const unsigned cp = std::stoul(s_.substr(i_, 4), nullptr, 16);
            i_ += 4;
            out += cp < 0x80 ? static_cast<char>(cp) : '?';  // the golden files are ASCII
            break;
          }
          default:
            out += e;
            break;
        }
      } else {
        out += c;
      }
    }
    Expect('"');
    return out;
  }
  Json Value() {
    Ws();
    if (i_ >= s_.size()) Fail("unexpected end");
    Json j;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      j.kind = Json::kObject;
      if (Eat('}')) return j;
      do {
        Ws();
        std::string key = String();
        Expect(':');
        j.obj.emplace_back(std::move(key), Value());
      } while (Eat(','));
      Expect('}');
    } else if (c == '[') {
      ++i_;
      j.kind = Json::kArray;
      if (Eat(']')) return j;
      do {
        j.arr.push_back(Value());
      } while (Eat(','));
      Expect(']');
    } else if (c == '"') {
      j.kind = Json::kString;
      j.str = String();
    } else if (s_.compare(i_, 4, "true") == 0) {
      i_ += 4;
      j.kind = Json::kBool;
      j.b = true;
    } else if (s_.compare(i_, 5, "false") == 0) {
      i_ += 5;
      j.kind = Json::kBool;
    } else if (s_.compare(i_, 4, "null") == 0) {
      i_ += 4;
    } else {
      const size_t start = i_;
      while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) ||
                                std::strchr("+-.eE", s_[i_]) != nullptr)) {
        ++i_;
      }
      if (start == i_) Fail("unexpected character");
      j.kind = Json::kNumber;
      j.num = std::stod(s_.substr(start, i_ - start));
    }
    return j;
  }

  const std::string& s_;
  size_t i_ = 0;
};

inline Json ParseJson(const std::string& text) { return JsonParser(text).Parse(); }

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

struct Tensor {
  std::string dtype;  // "F16", "U8", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

inline size_t SafetensorsDtypeBytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "U8" || dtype == "I8" || dtype == "BOOL") return 1;
  throw std::runtime_error("unknown safetensors dtype " + dtype);
}

inline std::map<std::string, Tensor> ReadSafetensors(const std::string& path) {
  const std::string file = ReadFile(path);
  if (file.size() < 8) throw std::runtime_error(path + ": shorter than 8 bytes");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  if (n > file.size() - 8) throw std::runtime_error(path + ": header length beyond the file");
  const Json header = ParseJson(file.substr(8, n));
  if (header.kind != Json::kObject) throw std::runtime_error(path + ": header is not an object");
  const size_t data_begin = 8 + n;
  std::map<std::string, Tensor> out;
  for (const auto& kv : header.obj) {
    if (kv.first == "__metadata__") continue;
    Tensor t;
    t.dtype = kv.second.At("dtype").Str();
    for (const Json& d : kv.second.At("shape").arr) t.shape.push_back(d.Int());
    const Json& offs = kv.second.At("data_offsets");
    if (offs.arr.size() != 2) throw std::runtime_error(path + ": bad data_offsets");
    const uint64_t b = offs.arr[0].Int(), e = offs.arr[1].Int();
    if (b > e || data_begin + e > file.size()) {
      throw std::runtime_error(path + ": tensor '" + kv.first + "' beyond the file");
    }
    if (e - b != static_cast<uint64_t>(t.numel()) * SafetensorsDtypeBytes(t.dtype)) {
      throw std::runtime_error(path + ": tensor '" + kv.first + "' size does not match its shape");
    }
    t.data.assign(file.begin() + data_begin + b, file.begin() + data_begin + e);
    out.emplace(kv.first, std::move(t));
  }
  return out;
}

}  // namespace kvt
