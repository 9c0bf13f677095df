/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TFRecord files
 * (train/tfevents.c). zlib's crc32 is the other polynomial, so it cannot serve. */
#ifndef MC_UTIL_CRC32C_H
#define MC_UTIL_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t mc_crc32c(const void *data, size_t n);

#endif
