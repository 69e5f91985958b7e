// A folder's newest run: its traces by run id, and the traces of the
// processes its processes started, whatever their own ids.
#include "viewer/run_groups.h"

#include "gtest/gtest.h"

namespace nanhunt {
namespace {

TraceIdentity Process(const std::string& file, const std::string& run_id, int64_t pid,
                      int64_t ppid, int64_t started, int64_t ended = 0) {
  TraceIdentity t;
  t.file = file;
  t.run_id = run_id;
  t.host = "vm";
  t.pid = pid;
  t.ppid = ppid;
  t.started = started;
  t.ended = ended;
  return t;
}

using Files = std::vector<std::string>;

TEST(RunGroups, AHelperProcessStartedByTheTrainingIsPartOfItsRun) {
  // torch.compile's probe: a child Python with an id of its own, newer.
  EXPECT_EQ(NewestRun({Process("old", "100-7", 7, 1, 100, 150),
                       Process("train", "200-10", 10, 1, 200),
                       Process("probe", "205-11", 11, 10, 205, 205)}),
            (Files{"probe", "train"}));
}

TEST(RunGroups, GrandchildrenJoinTooAndSharedIdsStayTogether) {
  // LD_PRELOAD torchrun: the launcher, its two ranks, a rank's worker.
  EXPECT_EQ(NewestRun({Process("launcher", "300-20", 20, 1, 300),
                       Process("rank0", "301-21", 21, 20, 301),
                       Process("rank1", "301-22", 22, 20, 301),
                       Process("worker", "302-23", 23, 22, 302),
                       Process("old-a", "run-a", 5, 1, 10, 20),
                       Process("old-b", "run-a", 6, 1, 11, 20)}),
            (Files{"launcher", "rank0", "rank1", "worker"}));
  EXPECT_EQ(NewestRun({Process("a", "run-a", 5, 1, 10, 20),
                       Process("b", "run-a", 6, 1, 11, 20)}),
            (Files{"a", "b"}));
}

TEST(RunGroups, AReusedPidDoesNotJoinAFinishedRun) {
  // pid 10 ran and ended at 150; a new process whose parent is another
  // pid 10 (started later) is a run of its own, and the newest.
  EXPECT_EQ(NewestRun({Process("first", "100-10", 10, 1, 100, 150),
                       Process("later", "400-12", 12, 10, 400)}),
            (Files{"later"}));
  // Nor one on another host.
  TraceIdentity other = Process("elsewhere", "120-12", 12, 10, 120);
  other.host = "gpu-node-2";
  EXPECT_EQ(NewestRun({Process("first", "100-10", 10, 1, 100, 150), other}),
            (Files{"elsewhere"}));
}

TEST(RunGroups, NewestIsByStartTimeNotByTheNamesOrder) {
  // NANHUNT_RUN_ID chosen by the user: "zz-old" sorts after "aa-new".
  EXPECT_EQ(NewestRun({Process("old", "zz-old", 5, 1, 100, 110),
                       Process("new", "aa-new", 6, 1, 500)}),
            (Files{"new"}));
}

TEST(RunGroups, UnreadableTracesFallBackToTheirIds) {
  // No meta (empty or corrupt files): ids alone decide, as names sort.
  EXPECT_EQ(NewestRun({Process("x1", "20260101-r1", 0, 0, 0),
                       Process("x2", "20260102-r2", 0, 0, 0)}),
            (Files{"x2"}));
  EXPECT_TRUE(NewestRun({}).empty());
}

}  // namespace
}  // namespace nanhunt
