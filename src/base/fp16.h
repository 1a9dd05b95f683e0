// Scalar conversions between f32 and the 16-bit float formats stored in model
// files and caches. These are the reference definitions; SIMD paths must
// agree with them bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

namespace kvq {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// IEEE binary16 -> binary32, exact for every input including subnormals,
// infinities and NaN.
inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return BitsToFloat(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return BitsToFloat(sign);
    // Subnormal: value = mantissa * 2^-24.
    float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign ? -magnitude : magnitude;
  }
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// binary32 -> binary16 with round-to-nearest-even; overflow goes to infinity,
// NaN stays NaN (quiet).
inline uint16_t F32ToF16(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or NaN
    return sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u);
  }
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                        // below 2^-14: subnormal f16
    // Scale so the f16 subnormal unit (2^-24) becomes 1, round to nearest even
    // through the FPU's default rounding.
    const float scaled = BitsToFloat(abs) * 16777216.0f;
    // nearbyint semantics without <cmath> dependency on rounding mode changes.
    uint32_t q = static_cast<uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(q);
    if (rest > 0.5f || (rest == 0.5f && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  // Normal: rebias exponent, round mantissa from 23 to 10 bits (nearest even).
  uint32_t rebased = abs - (112u << 23);
  const uint32_t round_bit = 1u << 12;
  const uint32_t lower = rebased & 0x1FFFu;
  rebased >>= 13;
  if (lower > round_bit || (lower == round_bit && (rebased & 1u))) ++rebased;
  return sign | static_cast<uint16_t>(rebased);
}

inline float Bf16ToF32(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

// Round-to-nearest-even; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace kvq
