// Step 99: not a step of the course, a fixture for fa-patch check-skeleton (tests: exercises/CMakeLists.txt).
// Its comment below quotes the line the exercise's hole cuts out, as a comment beside a lesson can.
namespace fa::step99 {

/// The weight of a partial sum with maximum m, merged under the largest maximum M.
float weight(float m, float M) {
  const float w = exp2f(m - M);  // 0 for a part that saw no key
  return w;
}

/// The merge weighs each part as weight() does: const float w = exp2f(m - M);
float merge(float m0, float l0, float m1, float l1);

}  // namespace fa::step99
