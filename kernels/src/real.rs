//! The scalar trait the reference ops are written over: f32 in production,
//! f64 for finite-difference checks of the same code.

use std::fmt::Debug;
use std::iter::Sum;
use std::ops::{AddAssign, DivAssign, MulAssign, SubAssign};

use num_traits::Float;

pub trait Real:
    Float
    + Default
    + Debug
    + Send
    + Sync
    + Sum
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + 'static
{
    /// C = alpha * A B + beta * C with general strides (row stride, col stride).
    ///
    /// # Safety
    /// The pointers and strides must describe valid, non-overlapping (for C)
    /// matrices A[m,k], B[k,n], C[m,n].
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );

    fn of_f64(x: f64) -> Self;
    fn as_f64(self) -> f64;
    fn of_f32(x: f32) -> Self;
    fn as_f32(self) -> f32;
}

impl Real for f32 {
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: *const f32,
        rsa: isize,
        csa: isize,
        b: *const f32,
        rsb: isize,
        csb: isize,
        beta: f32,
        c: *mut f32,
        rsc: isize,
        csc: isize,
    ) {
        // SAFETY: forwarded contract.
        unsafe {
            matrixmultiply::sgemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc)
        }
    }
    fn of_f64(x: f64) -> f32 {
        x as f32
    }
    fn as_f64(self) -> f64 {
        self as f64
    }
    fn of_f32(x: f32) -> f32 {
        x
    }
    fn as_f32(self) -> f32 {
        self
    }
}

impl Real for f64 {
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: f64,
        a: *const f64,
        rsa: isize,
        csa: isize,
        b: *const f64,
        rsb: isize,
        csb: isize,
        beta: f64,
        c: *mut f64,
        rsc: isize,
        csc: isize,
    ) {
        // SAFETY: forwarded contract.
        unsafe {
            matrixmultiply::dgemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc)
        }
    }
    fn of_f64(x: f64) -> f64 {
        x
    }
    fn as_f64(self) -> f64 {
        self
    }
    fn of_f32(x: f32) -> f64 {
        x as f64
    }
    fn as_f32(self) -> f32 {
        self as f32
    }
}
