/* CRC-32C (util/crc32c.h), one table of 256 entries built on first use. */
#include "util/crc32c.h"

static uint32_t table[256];
static int table_ready = 0;

static void build(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  table_ready = 1;
}

uint32_t mc_crc32c(const void *data, size_t n) {
  if (!table_ready) build();
  const unsigned char *p = data;
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}
