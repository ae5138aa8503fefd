// Element types of tensors, as safetensors names them (F32, BF16, ...): what a file stores and
// what a store unit or a weight holds. Does not convert (core/bf16.h widens bf16).
#pragma once

#include <cstddef>

namespace stratum {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

std::size_t dtype_size_bytes(DType dtype);
const char* dtype_name(DType dtype);  // "F32", "BF16", ... as spelled in safetensors headers

}  // namespace stratum
