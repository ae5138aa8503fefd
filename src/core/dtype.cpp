// DType names and sizes; see dtype.h.
#include "core/dtype.h"

#include "stratum/error.h"

namespace stratum {

std::size_t dtype_size_bytes(DType dtype) {
  switch (dtype) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: return 2;
    case DType::I8: case DType::U8: case DType::BOOL: return 1;
  }
  STRATUM_ASSERT(false && "unknown DType");
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
  }
  STRATUM_ASSERT(false && "unknown DType");
  return "";
}

}  // namespace stratum
