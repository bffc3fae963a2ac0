// CRC-32C (Castagnoli) for export blobs: detects every single-bit flip and every burst of up to
// 32 bits, which is what a transfer or storage check needs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvarn {

uint32_t Crc32c(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace kvarn
