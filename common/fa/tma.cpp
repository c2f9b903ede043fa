/// @file tma.cpp
/// @brief Tensor maps for the copy engine, built with the driver's cuTensorMapEncodeTiled.
#include "fa/tma.hpp"

#include "fa/cuda_check.hpp"
#include "fa/problem.hpp"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace fa::kit {
namespace {

/// cuTensorMapEncodeTiled, found through the runtime (cudaGetDriverEntryPointByVersion) rather than
/// linked: a program linked to the driver library would not even start on a machine without a driver,
/// where the CPU tests still run.
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 function = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    FA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !entry)
      throw std::runtime_error("cuTensorMapEncodeTiled not found in the CUDA driver (needs CUDA 12.0 or newer)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry);
  }();
  return function;
}

}  // namespace

CUtensorMap heads_tensor_map(const void* base, DType dtype, int batch, int seq, int heads, int head_dim,
                             int box_rows) {
  if (dtype != DType::f16 && dtype != DType::bf16 && dtype != DType::f32)
    throw InvalidProblem(std::string("tensor map: dtype = ") + to_string(dtype) + " is not supported; supported: f16, bf16, f32");
  const cuuint64_t element = dtype == DType::f32 ? 4 : 2;
  // 128 bytes a box row, the widest the 128-byte swizzle takes: 64 16-bit elements, or 32 floats.
  const int kBoxColumns = int(128 / element);
  if (head_dim % kBoxColumns != 0)
    throw InvalidProblem("tensor map: head_dim = " + std::to_string(head_dim) + " is not supported for " + to_string(dtype) +
                         "; supported: multiples of " + std::to_string(kBoxColumns));
  if (box_rows < 1 || box_rows > 256)
    throw InvalidProblem("tensor map: box_rows = " + std::to_string(box_rows) + " is not supported; supported: 1 to 256");

  // Sizes and strides, innermost dimension first; strides (bytes) are given for dimensions 1..3.
  const cuuint64_t sizes[4] = {cuuint64_t(head_dim), cuuint64_t(heads), cuuint64_t(seq), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {element * head_dim, element * head_dim * heads, element * head_dim * heads * seq};
  const cuuint32_t box[4] = {cuuint32_t(kBoxColumns), 1, cuuint32_t(box_rows), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult status = encode_tiled()(
      &map,
      dtype == DType::f32   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
      : dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                            : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
      4,
      const_cast<void*>(base), sizes, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS)
    throw std::runtime_error("cuTensorMapEncodeTiled failed with CUresult " + std::to_string(int(status)) +
                             " (tensor [" + std::to_string(batch) + ", " + std::to_string(seq) + ", " +
                             std::to_string(heads) + ", " + std::to_string(head_dim) + "], box of " +
                             std::to_string(box_rows) + " rows)");
  return map;
}

}  // namespace fa::kit
