//! BF16 rounding (round to nearest even, through `half`).

use half::bf16;

use crate::Real;

/// Round one value to the nearest BF16 and back.
#[inline]
pub fn round<T: Real>(x: T) -> T {
    T::of_f32(bf16::from_f32(x.as_f32()).to_f32())
}

/// Round every value of `x` to BF16 in place.
pub fn round_slice<T: Real>(x: &mut [T]) {
    for v in x {
        *v = round(*v);
    }
}

/// A BF16-rounded copy.
pub fn rounded<T: Real>(x: &[T]) -> Vec<T> {
    x.iter().map(|&v| round(v)).collect()
}
