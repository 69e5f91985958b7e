// Traces: what is written reads back; a trace cut off mid-write, or one
// that is not a trace at all, gives a clear answer instead of a crash.
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <initializer_list>
#include <utility>

#include "core/trace_writer.h"
#include "gtest/gtest.h"
#include "viewer/summary.h"
#include "viewer/trace_reader.h"

namespace nanhunt {
namespace {

class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/nanhunt_trace_test_" + std::to_string(getpid());
    mkdir(dir_.c_str(), 0755);
    path_ = dir_ + "/nanhunt-20260101-000000-1.sqlite";
  }
  void TearDown() override {
    std::string cmd = "rm -rf '" + dir_ + "'";
    ASSERT_EQ(system(cmd.c_str()), 0);
  }
  void WriteSample(int steps) {
    auto w = TraceWriter::Open(path_, std::chrono::milliseconds(50));
    ASSERT_TRUE(w.ok()) << w.status();
    (*w)->PutMeta("command", "python train.py");
    (*w)->PutMeta("ended", "1");
    for (int s = 0; s < steps; ++s) {
      OpStatsRow r;
      r.step = s;
      r.op = "aten::bmm";
      r.phase = "forward";
      r.dtype = "float16";
      r.calls = 2;
      r.max_abs = 1000.0 * (s + 1);
      (*w)->Add(r);
      StepRow st;
      st.step = s;
      st.ops = 10;
      st.nonfinite_ops = s == steps - 1 ? 1 : 0;
      (*w)->Add(st);
    }
    FindingRow f;
    f.kind = "origin";
    f.step = steps - 1;
    f.op = "aten::bmm";
    f.phase = "forward";
    f.posinf = 3;
    f.fp32_max_abs = 71000.0;
    f.source = "model.py:33 in forward";
    (*w)->Add(f);
    (*w)->Close();
  }
  // A finished trace holding only `meta` (with a command and an end).
  void WriteMeta(std::initializer_list<std::pair<const char*, const char*>> meta) {
    auto w = TraceWriter::Open(path_, std::chrono::milliseconds(50));
    ASSERT_TRUE(w.ok()) << w.status();
    (*w)->PutMeta("command", "python train.py");
    (*w)->PutMeta("ended", "1");
    for (const auto& [key, value] : meta) (*w)->PutMeta(key, value);
    (*w)->Close();
  }
  std::string dir_, path_;
};

TEST_F(TraceTest, WrittenRowsReadBackAndSummarise) {
  WriteSample(5);
  auto t = ReadTrace(path_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->problems.empty());
  EXPECT_EQ(t->meta["command"], "python train.py");
  ASSERT_EQ(t->ops.size(), 1u);
  EXPECT_EQ(t->ops[0].calls, 10);
  EXPECT_EQ(t->ops[0].max_abs, 5000.0);
  const RunSummary s = Summarise({*t});
  ASSERT_TRUE(s.first_origin.has_value());
  EXPECT_EQ(s.first_origin->op, "aten::bmm");
  EXPECT_EQ(s.nonfinite_steps, std::vector<int64_t>{4});
  const std::string json = RenderJson(s);
  EXPECT_NE(json.find("\"first_origin\":{\"kind\":\"origin\",\"op\":\"aten::bmm\""),
            std::string::npos) << json;
  EXPECT_NE(json.find("\"max_abs\":71000"), std::string::npos) << json;
}

TEST_F(TraceTest, TheDistributionsCodeAFindingCameThroughReadsBackAndOlderTracesLackIt) {
  {
    auto w = TraceWriter::Open(path_, std::chrono::milliseconds(50));
    ASSERT_TRUE(w.ok()) << w.status();
    (*w)->PutMeta("ended", "1");
    FindingRow f;
    f.kind = "origin";
    f.op = "aten::log";
    f.phase = "forward";
    f.neginf = 5;
    f.source = "train.py:10 in <module>";
    f.via = "Normal.log_prob (torch/distributions/normal.py:95)";
    (*w)->Add(f);
    (*w)->Close();
  }
  auto t = ReadTrace(path_);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->findings.size(), 1u);
  EXPECT_EQ(t->findings[0].via, "Normal.log_prob (torch/distributions/normal.py:95)");
  const RunSummary s = Summarise({*t});
  EXPECT_NE(RenderJson(s).find(
                "\"via\":\"Normal.log_prob (torch/distributions/normal.py:95)\""),
            std::string::npos);
  EXPECT_NE(RenderText(s, 100, false).find(
                "          at train.py:10 in <module>\n"
                "          inside Normal.log_prob (torch/distributions/normal.py:95)\n"),
            std::string::npos)
      << RenderText(s, 100, false);
  // Schema 8 and older: no via column.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "ALTER TABLE findings DROP COLUMN via", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  t = ReadTrace(path_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->problems.empty());
  ASSERT_EQ(t->findings.size(), 1u);
  EXPECT_EQ(t->findings[0].source, "train.py:10 in <module>");
  EXPECT_EQ(t->findings[0].via, "");
}

TEST_F(TraceTest, RenumberedStepsJoinTheStepTheyBelongTo) {
  // Micro-batches 2 and 3 of the first iteration were counted as steps 1
  // and 2 until the first update said otherwise: their rows join step 0,
  // and only rows written before the renumbering are touched.
  auto w = TraceWriter::Open(path_, std::chrono::milliseconds(50));
  ASSERT_TRUE(w.ok()) << w.status();
  (*w)->PutMeta("command", "./train");
  (*w)->PutMeta("ended", "1");
  for (int s = 0; s < 3; ++s) {
    StepRow st;
    st.step = s;
    st.ops = 10;
    (*w)->Add(st);
  }
  FindingRow f;
  f.kind = "origin";
  f.step = 2;
  f.op = "aten::dot";
  f.phase = "forward";
  f.posinf = 1;
  (*w)->Add(f);
  (*w)->Add(StepRenumberRow{1, 2, 0});
  StepRow last;
  last.step = 0;
  last.ops = 5;
  (*w)->Add(last);
  last.step = 1;
  (*w)->Add(last);
  (*w)->Close();
  auto t = ReadTrace(path_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->problems.empty()) << t->problems.front();
  ASSERT_EQ(t->steps.size(), 2u);
  EXPECT_EQ(t->steps[0].step, 0);
  EXPECT_EQ(t->steps[0].ops, 35);
  EXPECT_EQ(t->steps[1].step, 1);
  EXPECT_EQ(t->steps[1].ops, 5);
  ASSERT_EQ(t->findings.size(), 1u);
  EXPECT_EQ(t->findings[0].step, 0);
}

TEST_F(TraceTest, AfterCloseTheTraceFileAloneHoldsEverything) {
  // In a monitored process the writer is never destroyed (it is leaked on
  // purpose): Close must leave the rows in the main file, not in the WAL,
  // so that a trace copied on its own is complete.
  auto w = TraceWriter::Open(path_, std::chrono::milliseconds(50));
  ASSERT_TRUE(w.ok()) << w.status();
  (*w)->PutMeta("command", "python train.py");
  StepRow st;
  st.step = 7;
  (*w)->Add(st);
  (*w)->Close();
  const std::string copy = dir_ + "/copied-alone.sqlite";
  {
    std::ifstream in(path_, std::ios::binary);
    std::ofstream out(copy, std::ios::binary);
    out << in.rdbuf();
  }
  auto t = ReadTrace(copy);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->meta["command"], "python train.py");
  ASSERT_EQ(t->steps.size(), 1u);
  EXPECT_EQ(t->steps[0].step, 7);
}

TEST_F(TraceTest, ALongRunStaysUnderTheCapAndKeepsEveryFinding) {
  // 20,000 steps x 20 ops of statistics would take ~40 MB; the cap is 2 MB.
  const int64_t cap = 2000000;
  auto w = TraceWriter::Open(path_, std::chrono::milliseconds(10), cap);
  ASSERT_TRUE(w.ok()) << w.status();
  (*w)->PutMeta("command", "python train.py");
  for (int64_t step = 0; step < 20000; ++step) {
    for (int op = 0; op < 20; ++op) {
      OpStatsRow r;
      r.step = step;
      r.op = "aten::op" + std::to_string(op);
      r.phase = "forward";
      r.dtype = "float16";
      r.calls = 1;
      r.max_abs = 1.0 + step;
      (*w)->Add(r);
    }
    StepRow st;
    st.step = step;
    (*w)->Add(st);
    if (step % 100 == 0) {
      FindingRow f;
      f.kind = "near_max";
      f.step = step;
      f.op = "aten::op0";
      (*w)->Add(f);
    }
    if (step % 500 == 0) (*w)->Flush();
  }
  (*w)->Close();
  struct stat st{};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  // With room to spare: thinning alone leaves pages partly used and the
  // file grew to 98 % of the cap here (and past it once, in a real run).
  EXPECT_LT(st.st_size, cap * 8 / 10);
  auto t = ReadTrace(path_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->findings.size(), 200u) << "findings are never dropped";
  EXPECT_NE(t->meta["thinned"].find("keep one step in"), std::string::npos);
  ASSERT_FALSE(t->steps.empty());
  EXPECT_EQ(t->steps.back().step, 19999);
  // The recent past is whole.
  int64_t recent = 0;
  for (const StepRow& s : t->steps) recent += s.step >= 19800;
  EXPECT_EQ(recent, 200);
}

TEST_F(TraceTest, FlushMakesRowsVisibleToAReaderWhileTheWriterRuns) {
  auto w = TraceWriter::Open(path_, std::chrono::seconds(60));
  ASSERT_TRUE(w.ok());
  (*w)->PutMeta("command", "x");
  FindingRow f;
  f.kind = "origin";
  f.op = "aten::exp";
  (*w)->Add(f);
  (*w)->Flush();
  auto t = ReadTrace(path_);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->findings.size(), 1u);
  EXPECT_EQ(t->findings[0].op, "aten::exp");
  // Not ended: the reader says so rather than pretending it is complete.
  ASSERT_FALSE(t->problems.empty());
  EXPECT_NE(t->problems.back().find("did not finish"), std::string::npos);
}

TEST_F(TraceTest, TruncatedTraceStillOpensWithWhatCanBeRead) {
  WriteSample(3000);
  struct stat st {};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  ASSERT_GT(st.st_size, 16 * 4096) << "sample too small to cut";
  ASSERT_EQ(truncate(path_.c_str(), st.st_size / 2), 0);
  auto t = ReadTrace(path_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->problems.empty()) << "a cut trace must say it is incomplete";
  const std::string text = RenderText(Summarise({*t}), 100, false);
  EXPECT_NE(text.find("NOTES"), std::string::npos) << text;
}

TEST_F(TraceTest, WhatCudaGraphsKeptFromTheCheckIsANote) {
  // A run whose steps were captured into CUDA graphs must not read as
  // "all finite" without saying that those ops were never checked.
  WriteMeta({{"outputs_in_graph_capture", "412"}, {"optimizer_steps_in_graph_capture", "1"}});
  auto t = ReadTrace(path_);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->problems.size(), 2u);
  EXPECT_NE(t->problems[0].find("412 op outputs were captured into CUDA graphs"),
            std::string::npos) << t->problems[0];
  EXPECT_NE(t->problems[1].find("1 optimizer steps ran inside a CUDA graph capture"),
            std::string::npos) << t->problems[1];
  const std::string text = RenderText(Summarise({*t}), 100, false);
  EXPECT_NE(text.find("when the graphs replay"), std::string::npos) << text;
}

TEST_F(TraceTest, TheOpsWhoseOutputsWentUncheckedAreNamedWithWhy) {
  // Schema 6: the notes name the ops behind each count, and the JSON lists
  // every (op, phase, reason) with its outputs and steps.
  {
    auto w = TraceWriter::Open(path_, std::chrono::milliseconds(50));
    ASSERT_TRUE(w.ok()) << w.status();
    (*w)->PutMeta("ended", "1");
    (*w)->PutMeta("outputs_in_graph_capture", "144");
    (*w)->PutMeta("outputs_unchecked", "3");
    (*w)->PutMeta("unchecked_reason", "outputs on a GPU: the GPU check could not be enqueued");
    (*w)->Add(UncheckedRow{"aten::addmm", "forward", "graph_capture", 96, 3, 3});
    (*w)->Add(UncheckedRow{"aten::add_", "optimizer", "graph_capture", 48, 3, 3});
    (*w)->Add(UncheckedRow{"aten::mul", "backward", "not_enqueued", 3, 8, 11});
    (*w)->Close();
  }
  auto t = ReadTrace(path_);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->unchecked.size(), 3u);
  ASSERT_EQ(t->problems.size(), 2u);
  EXPECT_NE(t->problems[0].find("3 floating-point op outputs were not checked (outputs on a "
                                "GPU: the GPU check could not be enqueued): aten::mul "
                                "(backward) 3; \"all finite\""),
            std::string::npos)
      << t->problems[0];
  EXPECT_NE(t->problems[1].find("144 op outputs were captured into CUDA graphs (aten::addmm "
                                "(forward) 96, aten::add_ (optimizer) 48): not checked"),
            std::string::npos)
      << t->problems[1];
  const std::string json = RenderJson(Summarise({*t, *t}));  // two ranks add up
  EXPECT_NE(json.find("\"unchecked_ops\":[{\"op\":\"aten::addmm\",\"phase\":\"forward\","
                      "\"reason\":\"graph_capture\",\"outputs\":192,\"first_step\":3,"
                      "\"last_step\":3}"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("{\"op\":\"aten::mul\",\"phase\":\"backward\",\"reason\":"
                      "\"not_enqueued\",\"outputs\":6,\"first_step\":8,\"last_step\":11}]"),
            std::string::npos)
      << json;
}

TEST_F(TraceTest, ATraceWithoutTheUncheckedTableStillSaysTheCounts) {
  // Schema 5 and older: the counts without the ops.
  WriteMeta({{"outputs_in_graph_capture", "412"}});
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "DROP TABLE unchecked_outputs", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto t = ReadTrace(path_);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->problems.size(), 1u);
  EXPECT_NE(t->problems[0].find("412 op outputs were captured into CUDA graphs: not checked"),
            std::string::npos)
      << t->problems[0];
  EXPECT_NE(RenderJson(Summarise({*t})).find("\"unchecked_ops\":[]"), std::string::npos);
}

TEST_F(TraceTest, ATraceWithoutMaskRowsHasItsMasksInferredAsBefore) {
  // Schema 6 and older: an op's mask calls merged with its others, the ops
  // that masked listed in meta mask_ops.
  WriteMeta({{"mask_ops", "aten::masked_fill"}});
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "DROP TABLE op_stats;"
                         "CREATE TABLE op_stats(step INTEGER, op TEXT, phase TEXT, dtype TEXT,"
                         " calls INTEGER, elements INTEGER, nan INTEGER, posinf INTEGER,"
                         " neginf INTEGER, near_max INTEGER, underflow INTEGER,"
                         " fp16_overflow INTEGER, max_abs REAL);"
                         "INSERT INTO op_stats VALUES"
                         " (0, 'aten::masked_fill', 'forward', 'float16', 1, 8, 0, 0, 4, 0, 0, 0,"
                         "  9e999),"
                         " (1, 'aten::masked_fill', 'forward', 'float16', 1, 8, 0, 0, 4, 0, 0, 0,"
                         "  9e999),"
                         " (1, 'aten::bmm', 'forward', 'float16', 1, 8, 0, 2, 0, 0, 0, 0, 9e999);"
                         "INSERT INTO steps VALUES (0, 2, 0, 0, 1, 0, 0), (1, 2, 1, 1, 1, 0, 0);",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto t = ReadTrace(path_, /*with_series=*/true);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->ops.size(), 2u);
  for (const OpTotals& o : t->ops) EXPECT_EQ(o.mask, o.op == "aten::masked_fill") << o.op;
  ASSERT_EQ(t->op_steps.size(), 3u);
  EXPECT_TRUE(t->op_steps[0].mask) << "a step with no real inf/NaN";
  EXPECT_FALSE(t->op_steps[1].mask) << "beside the bmm's overflow: counted, as before";
  EXPECT_FALSE(t->op_steps[2].mask);
}

TEST_F(TraceTest, TheViewSaysWhatTheGpuChecked) {
  // Checks enqueued, the batches that carried them, and how often a full
  // result ring made the training's thread wait.
  WriteMeta({{"device_checks", "38640"}, {"device_check_batches", "2000"},
             {"check_ring_waits", "3"}});
  auto t = ReadTrace(path_);
  ASSERT_TRUE(t.ok()) << t.status();
  const RunSummary s = Summarise({*t});
  const std::string text = RenderText(s, 120, false);
  EXPECT_NE(text.find("gpu:     38640 outputs checked on the device in 2000 held-back "
                      "batches (19.3 a batch), result ring full 3 times"),
            std::string::npos)
      << text;
  const std::string json = RenderJson(s);
  EXPECT_NE(json.find("\"gpu_checks\":38640,\"gpu_check_batches\":2000,\"ring_waits\":3"),
            std::string::npos)
      << json;
  // No GPU: no line.
  ASSERT_EQ(unlink(path_.c_str()), 0);
  WriteMeta({{"outputs_in_graph_capture", "0"}});
  auto cpu = ReadTrace(path_);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(RenderText(Summarise({*cpu}), 120, false).find("gpu:"), std::string::npos);
}

TEST_F(TraceTest, HeldBackChecksThatWereDroppedOrStoppedAreNotes) {
  // NANHUNT_GPU_BATCH: outputs whose memory went before their check, and
  // auto's stop, which stderr said only once, mid-run.
  WriteMeta({{"outputs_released_before_check", "7"},
             {"gpu_batch_stopped",
              "/opt/ext/libmyop.so launches CUDA kernels of its own: checks op by op "
              "from then on"}});
  auto t = ReadTrace(path_);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->problems.size(), 2u);
  EXPECT_NE(t->problems[0].find("7 GPU op outputs held back for a batch gave their memory "
                                "back before their check ran"),
            std::string::npos)
      << t->problems[0];
  EXPECT_NE(t->problems[1].find("NANHUNT_GPU_BATCH=auto stopped batching: /opt/ext/libmyop.so"),
            std::string::npos)
      << t->problems[1];
  ASSERT_EQ(unlink(path_.c_str()), 0);
  WriteMeta({{"outputs_released_before_check", "0"}});
  auto none = ReadTrace(path_);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->problems.empty());
}

TEST_F(TraceTest, NoGraphCaptureNoNote) {
  WriteMeta({{"outputs_in_graph_capture", "0"}});
  auto t = ReadTrace(path_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->problems.empty()) << t->problems.front();
}

TEST_F(TraceTest, NotATraceGivesAClearError) {
  std::ofstream(path_) << "this is not sqlite at all, just some text\n";
  auto t = ReadTrace(path_);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find(path_), std::string::npos);
}

TEST_F(TraceTest, FolderViewKeepsTheNewestRunUnlessAskedForAll) {
  for (const char* name : {"nanhunt-20260101-000000-r1-10.sqlite",
                           "nanhunt-20260101-000000-r1-11.sqlite",
                           "nanhunt-20260102-000000-r2-12.sqlite"}) {
    std::ofstream(dir_ + "/" + name) << "";
  }
  auto newest = FindTraceFiles({dir_}, false);
  ASSERT_TRUE(newest.ok());
  ASSERT_EQ(newest->size(), 1u);
  EXPECT_NE((*newest)[0].find("r2-12"), std::string::npos);
  auto all = FindTraceFiles({dir_}, true);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 3u);
  EXPECT_FALSE(FindTraceFiles({dir_ + "/missing"}, false).ok());
}

}  // namespace
}  // namespace nanhunt
