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

HostTensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
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
  const std::string descr = match[1];
  DType dtype;
  if (descr == "<f4") dtype = DType::f32;
  else if (descr == "<f2") dtype = DType::f16;
  else if (descr == "<u2" || descr == "<V2" || descr == "|V2")
    fail(path, "element type '" + descr + "' (16-bit raw bits, e.g. bfloat16) is not supported: numpy has no "
               "bfloat16; save bf16 data as float32 '<f4' and pass --dtype bf16 to round it back");
  else fail(path, "element type '" + descr + "' is not supported (need float32 '<f4' or float16 '<f2')");
  if (std::regex_search(header, std::regex("'fortran_order':\\s*True")))
    fail(path, "Fortran-ordered arrays are not supported (save with np.ascontiguousarray)");
  if (!std::regex_search(header, match, std::regex("'shape':\\s*\\(([^)]*)\\)")))
    fail(path, "header has no shape");
  std::vector<std::int64_t> shape;
  std::stringstream dims(match[1].str());
  for (std::string item; std::getline(dims, item, ',');) {
    if (item.find_first_not_of(" ") == std::string::npos) continue;
    shape.push_back(std::stoll(item));
  }

  HostTensor tensor(dtype, shape);
  if (!in.read(reinterpret_cast<char*>(tensor.bytes.data()), tensor.bytes.size()))
    fail(path, "file holds fewer bytes than its shape needs");
  return tensor;
}

void write_npy(const std::string& path, const HostTensor& tensor_in) {
  // NumPy cannot hold bfloat16: write its values as float32, which is exact.
  const HostTensor widened = tensor_in.dtype == DType::bf16 ? converted(tensor_in, DType::f32) : HostTensor{};
  const HostTensor& tensor = tensor_in.dtype == DType::bf16 ? widened : tensor_in;
  std::ostringstream dict;
  dict << "{'descr': '" << (tensor.dtype == DType::f32 ? "<f4" : "<f2")
       << "', 'fortran_order': False, 'shape': (";
  for (auto extent : tensor.shape) dict << extent << ", ";
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
  out.write(reinterpret_cast<const char*>(tensor.bytes.data()), tensor.bytes.size());
  if (!out) fail(path, "write failed");
}

}  // namespace fa
