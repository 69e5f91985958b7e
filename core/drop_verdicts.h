// Whether the inf/NaN a step made outlived it is asked as its optimizer
// step ends (Monitor::OnOptimizerStepEnd): if no tensor that held them is
// alive any more, they were dropped (a softmax's NaN over fully masked rows,
// zeroed right after). On a GPU the step's results have not arrived by
// then; its verdict waits for them. DropVerdicts keeps the count of GPU ops
// still to be judged, by the update they ran before, and the verdicts
// waiting for them.
//
// Not thread-safe: the monitor calls it under its lock.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/btree_map.h"

namespace nanhunt {

class DropVerdicts {
 public:
  // A step's verdict, waiting for the GPU ops noted before its update's end.
  struct Waiting {
    int64_t step = 0;
    int64_t generation = 0;     // the update's: ops of it and before
    int64_t nonfinite_ops = 0;  // ops of the step with inf/NaN, so far
  };

  // A GPU op whose result is judged later was noted: returns the
  // generation to give back with OpJudged (the number of updates ended
  // before it).
  int64_t OpNoted() {
    ++outstanding_[generation_];
    return generation_;
  }
  // That op was judged.
  void OpJudged(int64_t generation);

  // An update (an optimizer record) of `step` ended. With GPU ops still to
  // be judged, its verdict waits for them: `nonfinite_ops` of its ops had
  // inf/NaN so far (a step of several records waits for its last one).
  // Returns whether it waits.
  bool UpdateEnded(int64_t step, int64_t nonfinite_ops);
  // An op of `step` with inf/NaN was counted after its update ended.
  void CountNonFinite(int64_t step);

  // Whether a waiting verdict's ops have all been judged, and a later step
  // than its own has begun (`current_step`): the program trained on. Judged
  // later than at the update's end, a tensor freed in between counts as
  // dropped; a program that stopped after the step (its training function
  // returned, its locals and model freed) gets no verdict for it.
  bool AnyReady(int64_t current_step) const;
  // Those verdicts, taken out, oldest first.
  std::vector<Waiting> TakeReady(int64_t current_step);

 private:
  bool IsReady(const Waiting& w, int64_t current_step) const;

  int64_t generation_ = 0;  // updates ended so far
  absl::btree_map<int64_t, int64_t> outstanding_;  // generation -> ops
  std::vector<Waiting> waiting_;  // oldest first
};

}  // namespace nanhunt
