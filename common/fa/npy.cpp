/// @file npy.cpp
/// @brief Reading and writing .npy files.
// The .npy format: magic "\x93NUMPY", a version, a little-endian header length,
// a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (..)},
// padded so the data starts 64-byte aligned, then the raw data.
#include "fa/npy.hpp"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>

namespace fa {

namespace {
/// Throws std::runtime_error("<path>: <what>").
[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}
}  // namespace

namespace {
/// A .npy file's element type ('<f4', '<i4', ...) and shape, read up to its data.
struct Header {
  std::string descr;                ///< the element type, e.g. '<f4', '<i4'
  std::vector<std::int64_t> shape;  ///< the array's dimensions
};

/// Opens `path` and reads its header: `in` is left at the first byte of the data.
Header read_header(std::ifstream& in, const std::string& path) {
  in.open(path, std::ios::binary);
  if (!in) fail(path, "cannot open file");
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail(path, "not a .npy file");
  const int major = static_cast<unsigned char>(magic[6]);
  std::uint32_t header_len = 0;
  if (major == 1) {
    unsigned char len[2];
    if (!in.read(reinterpret_cast<char*>(len), 2)) fail(path, "truncated header");
    header_len = len[0] | (len[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char len[4];
    if (!in.read(reinterpret_cast<char*>(len), 4)) fail(path, "truncated header");
    header_len = len[0] | (len[1] << 8) | (len[2] << 16) | (std::uint32_t(len[3]) << 24);
  } else {
    fail(path, "unsupported .npy version " + std::to_string(major));
  }
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) fail(path, "truncated header");

  std::smatch match;
  if (!std::regex_search(header, match, std::regex("'descr':\\s*'([^']*)'")))
    fail(path, "header has no descr");
  Header out{match[1], {}};
  if (std::regex_search(header, std::regex("'fortran_order':\\s*True")))
    fail(path, "Fortran-ordered arrays are not supported (save with np.ascontiguousarray)");
  if (!std::regex_search(header, match, std::regex("'shape':\\s*\\(([^)]*)\\)")))
    fail(path, "header has no shape");
  std::stringstream dims(match[1].str());
  for (std::string item; std::getline(dims, item, ',');) {
    if (item.find_first_not_of(" ") == std::string::npos) continue;
    out.shape.push_back(std::stoll(item));
  }
  return out;
}

/// Writes a version 1.0 .npy file of element type `descr`, `shape`, and `bytes` bytes of data.
void write_file(const std::string& path, const char* descr, const std::vector<std::int64_t>& shape, const void* data,
                std::size_t bytes) {
  std::ostringstream dict;
  dict << "{'descr': '" << descr << "', 'fortran_order': False, 'shape': (";
  for (auto extent : shape) dict << extent << ", ";
  dict << "), }";
  std::string header = dict.str();
  const std::size_t unpadded = 10 + header.size() + 1;  // magic+version+len, header, newline
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');

  std::ofstream out(path, std::ios::binary);
  if (!out) fail(path, "cannot create file");
  const unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xFF),
                                static_cast<unsigned char>(header.size() >> 8)};
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(len), 2);
  out.write(header.data(), header.size());
  out.write(reinterpret_cast<const char*>(data), std::streamsize(bytes));
  if (!out) fail(path, "write failed");
}
}  // namespace

HostTensor read_npy(const std::string& path) {
  std::ifstream in;
  const Header header = read_header(in, path);
  const std::string& descr = header.descr;
  DType dtype;
  if (descr == "<f4") dtype = DType::f32;
  else if (descr == "<f2") dtype = DType::f16;
  else if (descr == "<u2" || descr == "<V2" || descr == "|V2")
    fail(path, "element type '" + descr + "' (16-bit raw bits, e.g. bfloat16) is not supported: numpy has no "
               "bfloat16; save bf16 data as float32 '<f4' and pass --dtype bf16 to round it back");
  else fail(path, "element type '" + descr + "' is not supported (need float32 '<f4' or float16 '<f2')");
  HostTensor tensor(dtype, header.shape);
  if (!in.read(reinterpret_cast<char*>(tensor.bytes.data()), tensor.bytes.size()))
    fail(path, "file holds fewer bytes than its shape needs");
  return tensor;
}

void write_npy(const std::string& path, const HostTensor& tensor_in) {
  // NumPy cannot hold bfloat16: write its values as float32, which is exact.
  const HostTensor widened = tensor_in.dtype == DType::bf16 ? converted(tensor_in, DType::f32) : HostTensor{};
  const HostTensor& tensor = tensor_in.dtype == DType::bf16 ? widened : tensor_in;
  write_file(path, tensor.dtype == DType::f32 ? "<f4" : "<f2", tensor.shape, tensor.bytes.data(), tensor.bytes.size());
}

NpyInts read_npy_ints(const std::string& path) {
  std::ifstream in;
  const Header header = read_header(in, path);
  NpyInts out{header.shape, {}};
  std::int64_t count = 1;
  for (auto extent : header.shape) count *= extent;
  if (header.descr == "<i4") {
    out.values.resize(std::size_t(count));
    if (!in.read(reinterpret_cast<char*>(out.values.data()), std::streamsize(count * 4)))
      fail(path, "file holds fewer bytes than its shape needs");
  } else if (header.descr == "<i8") {  // numpy's default int: each value must fit in int32
    std::vector<std::int64_t> wide(static_cast<std::size_t>(count));
    if (!in.read(reinterpret_cast<char*>(wide.data()), std::streamsize(count * 8)))
      fail(path, "file holds fewer bytes than its shape needs");
    for (std::int64_t value : wide) {
      if (value < INT32_MIN || value > INT32_MAX) fail(path, "value " + std::to_string(value) + " does not fit in int32");
      out.values.push_back(int(value));
    }
  } else {
    fail(path, "element type '" + header.descr + "' is not supported (need int32 '<i4' or int64 '<i8')");
  }
  return out;
}

void write_npy_ints(const std::string& path, const std::vector<std::int64_t>& shape, const std::vector<int>& values) {
  write_file(path, "<i4", shape, values.data(), values.size() * sizeof(int));
}

}  // namespace fa
