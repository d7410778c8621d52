/* test-tensor.c — data types, shapes and regions (sim/tensor.c). */
#include <criterion/criterion.h>

#include "parasol-sim.h"

Test(dtype, names_round_trip)
{
  /* Every dtype's canonical name reads back as itself. */
  for (int t = 0; t < SIM_DTYPE_COUNT; t++)
    cr_assert_eq(sim_dtype_from_name(sim_dtype_name(t)), t, "%s", sim_dtype_name(t));
  cr_assert_str_eq(sim_dtype_name(SIM_DTYPE_BF16), "bf16");
}

Test(dtype, aliases)
{
  /* The spellings of PyTorch and NumPy are accepted. */
  cr_assert_eq(sim_dtype_from_name("float32"), SIM_DTYPE_FP32);
  cr_assert_eq(sim_dtype_from_name("float"), SIM_DTYPE_FP32);
  cr_assert_eq(sim_dtype_from_name("float16"), SIM_DTYPE_FP16);
  cr_assert_eq(sim_dtype_from_name("half"), SIM_DTYPE_FP16);
  cr_assert_eq(sim_dtype_from_name("bfloat16"), SIM_DTYPE_BF16);
  cr_assert_eq(sim_dtype_from_name("fp8"), SIM_DTYPE_FP8);
  cr_assert_eq(sim_dtype_from_name("int32"), SIM_DTYPE_INT32);
  cr_assert_eq(sim_dtype_from_name("int64"), SIM_DTYPE_INT64);
  cr_assert_eq(sim_dtype_from_name("FP16"), SIM_DTYPE_FP16);
  cr_assert_eq(sim_dtype_from_name("complex64"), -1);
}

Test(dtype, sizes)
{
  /* Bytes per element: 4, 2, 2, 1, 4, 8. */
  cr_assert_eq(sim_dtype_size(SIM_DTYPE_FP32), 4);
  cr_assert_eq(sim_dtype_size(SIM_DTYPE_FP16), 2);
  cr_assert_eq(sim_dtype_size(SIM_DTYPE_BF16), 2);
  cr_assert_eq(sim_dtype_size(SIM_DTYPE_FP8), 1);
  cr_assert_eq(sim_dtype_size(SIM_DTYPE_INT32), 4);
  cr_assert_eq(sim_dtype_size(SIM_DTYPE_INT64), 8);
}

Test(shape, make_numel_equal_string)
{
  int64_t d[] = { 64, 3, 224, 224 };
  SimShape s = sim_shape_make(4, d);
  /* 64 * 3 * 224 * 224 = 9,633,792 elements. */
  cr_assert_eq(sim_shape_numel(&s), 9633792);
  g_autofree char *str = sim_shape_to_string(&s);
  cr_assert_str_eq(str, "[64, 3, 224, 224]");
  SimShape t = s;
  cr_assert(sim_shape_equal(&s, &t));
  t.dims[3] = 225;
  cr_assert_not(sim_shape_equal(&s, &t));
  t = sim_shape_make(3, d);
  cr_assert_not(sim_shape_equal(&s, &t));
  /* A scalar has one element and prints as []. */
  SimShape scalar = sim_shape_make(0, NULL);
  cr_assert_eq(sim_shape_numel(&scalar), 1);
  g_autofree char *ss = sim_shape_to_string(&scalar);
  cr_assert_str_eq(ss, "[]");
}

static SimRegion box2(int64_t a0, int64_t b0, int64_t a1, int64_t b1)
{
  SimRegion r = { .ndim = 2, .lo = { a0, a1 }, .hi = { b0, b1 } };
  return r;
}

Test(region, full_and_volume)
{
  int64_t d[] = { 8, 16 };
  SimShape s = sim_shape_make(2, d);
  SimRegion r = sim_region_full(&s);
  cr_assert_eq(r.lo[0], 0);
  cr_assert_eq(r.hi[1], 16);
  cr_assert_eq(sim_region_volume(&r), 128);
  /* A range with hi <= lo is empty. */
  SimRegion e = box2(3, 3, 0, 16);
  cr_assert_eq(sim_region_volume(&e), 0);
}

Test(region, intersect)
{
  /* [0,4)x[0,8) and [2,6)x[4,12) meet in [2,4)x[4,8): 2 * 4 = 8 elements. */
  SimRegion a = box2(0, 4, 0, 8), b = box2(2, 6, 4, 12), out;
  cr_assert(sim_region_intersect(&a, &b, &out));
  cr_assert(sim_region_equal(&out, &(SimRegion){ .ndim = 2, .lo = { 2, 4 }, .hi = { 4, 8 } }));
  cr_assert_eq(sim_region_volume(&out), 8);
  /* Touching boxes share nothing: half-open ranges. */
  SimRegion c = box2(4, 8, 0, 8);
  cr_assert_not(sim_region_intersect(&a, &c, &out));
  cr_assert_eq(sim_region_volume(&out), 0);
}

Test(region, equal_and_contains)
{
  SimRegion a = box2(0, 4, 0, 8), b = box2(1, 3, 2, 8), c = box2(1, 5, 2, 8);
  cr_assert(sim_region_equal(&a, &a));
  cr_assert_not(sim_region_equal(&a, &b));
  cr_assert(sim_region_contains(&a, &b));
  cr_assert_not(sim_region_contains(&b, &a));
  cr_assert_not(sim_region_contains(&a, &c));
  /* The empty box is inside any box. */
  SimRegion e = box2(9, 9, 9, 9);
  cr_assert(sim_region_contains(&b, &e));
}
