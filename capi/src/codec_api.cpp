// Configurations, record layout and the codec (layer 1).
#include <cstring>
#include <string>

#include "capi/src/shim.h"
#include "core/baselines.h"
#include "core/config.h"
#include "core/ops.h"
#include "kvarn/kvarn_experimental.h"  // kvarn_baseline_roundtrip

using kvarn::Config;
using kvarn::Status;
using kvarn::capi::Guard;
using kvarn::capi::NeedContext;

extern "C" {

void kvarn_config_defaults(kvarn_config_t* config) {
  if (config != nullptr) kvarn::DefaultConfig(config);
}

kvarn_status_t kvarn_config_from_preset(const char* preset, int32_t head_dim,
                                        kvarn_config_t* config) {
  return Guard([&]() -> Status {
    if (config == nullptr) return kvarn::InvalidArgument("config is NULL");
    kvarn_config_t tmp;  // written to *config only on success
    KVARN_RETURN_IF_ERROR(kvarn::ConfigFromPreset(preset, head_dim, &tmp));
    *config = tmp;
    return Status::Ok();
  });
}

int32_t kvarn_preset_count(void) { return kvarn::PresetCount(); }

const char* kvarn_preset_name(int32_t index) { return kvarn::PresetName(index); }

kvarn_status_t kvarn_config_validate(const kvarn_config_t* config) {
  return Guard([&] {
    Config c;
    return kvarn::ParseConfig(config, &c);
  });
}

kvarn_status_t kvarn_record_bytes(const kvarn_config_t* config, size_t* out_bytes) {
  return Guard([&]() -> Status {
    Config c;
    KVARN_RETURN_IF_ERROR(kvarn::ParseConfig(config, &c));
    if (out_bytes == nullptr) return kvarn::InvalidArgument("out_bytes is NULL");
    *out_bytes = c.record_bytes();
    return Status::Ok();
  });
}

kvarn_status_t kvarn_record_field(const kvarn_config_t* config, kvarn_record_field_t field,
                                  size_t* out_offset, size_t* out_bytes) {
  return Guard([&]() -> Status {
    Config c;
    KVARN_RETURN_IF_ERROR(kvarn::ParseConfig(config, &c));
    const int32_t f = kvarn::EnumInt(field);  // checked as an integer first (kvarn.h)
    if (f < 0 || f >= KVARN_FIELD_COUNT) {
      return kvarn::InvalidArgument("field " + std::to_string(f) + " out of range");
    }
    if (out_offset == nullptr || out_bytes == nullptr) {
      return kvarn::InvalidArgument("out_offset or out_bytes is NULL");
    }
    *out_offset = c.layout.offset[f];
    *out_bytes = c.layout.bytes[f];
    return Status::Ok();
  });
}

kvarn_status_t kvarn_rotate(kvarn_context_t* context, int32_t head_dim, size_t n_rows,
                            kvarn_dtype_t in_dtype, const void* in, kvarn_dtype_t out_dtype,
                            void* out) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedContext(context));
    KVARN_RETURN_IF_ERROR(kvarn::CheckDtypeArg(in_dtype, "in_dtype"));
    KVARN_RETURN_IF_ERROR(kvarn::CheckDtypeArg(out_dtype, "out_dtype"));
    return kvarn::OpRotate(context->impl.get(), head_dim, n_rows, in_dtype, in, out_dtype, out);
  });
}

kvarn_status_t kvarn_quantize(kvarn_context_t* context, const kvarn_config_t* config,
                              size_t n_tiles, kvarn_dtype_t dtype, const void* k, const void* v,
                              uint32_t flags, void* records, size_t record_stride) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedContext(context));
    Config c;
    KVARN_RETURN_IF_ERROR(kvarn::ParseConfig(config, &c));
    KVARN_RETURN_IF_ERROR(kvarn::CheckDtypeArg(dtype, "dtype"));
    return kvarn::OpQuantize(context->impl.get(), c, n_tiles, dtype, k, v, flags, records,
                             record_stride);
  });
}

kvarn_status_t kvarn_dequantize(kvarn_context_t* context, const kvarn_config_t* config,
                                size_t n_tiles, const void* records, size_t record_stride,
                                uint32_t flags, kvarn_dtype_t out_dtype, void* k_out, void* v_out) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedContext(context));
    Config c;
    KVARN_RETURN_IF_ERROR(kvarn::ParseConfig(config, &c));
    KVARN_RETURN_IF_ERROR(kvarn::CheckDtypeArg(out_dtype, "out_dtype"));
    return kvarn::OpDequantize(context->impl.get(), c, n_tiles, records, record_stride, flags,
                               out_dtype, k_out, v_out);
  });
}

kvarn_status_t kvarn_baseline_roundtrip(kvarn_baseline_t method, int32_t bits, size_t rows,
                                        int32_t cols, const float* in, float* out) {
  return Guard([&]() -> Status {
    const int32_t m = kvarn::EnumInt(method);
    if (m != KVARN_BASELINE_PER_TOKEN_RTN && m != KVARN_BASELINE_FP8_E4M3) {
      return kvarn::InvalidArgument("unknown baseline method " + std::to_string(m));
    }
    return kvarn::BaselineRoundtrip(method, bits, rows, cols, in, out);
  });
}

}  // extern "C"
