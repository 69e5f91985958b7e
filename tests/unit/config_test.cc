// Configuration: defaults, precise errors, the config file, and precedence.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "gtest/gtest.h"

namespace nanhunt {
namespace {

absl::StatusOr<Config> Load(const std::map<std::string, std::string>& env) {
  std::vector<std::string> names;
  for (const auto& [k, v] : env) names.push_back(k);
  return LoadConfig(
      [&](const char* name) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      },
      names);
}

TEST(Config, DefaultsCheckEveryOpWithAQuarterOfFp16Max) {
  auto c = Load({});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->mode, Mode::kCheck);
  EXPECT_EQ(c->near_max, 16376.0);
  EXPECT_EQ(c->out_dir, "nanhunt-out");
  EXPECT_TRUE(c->follow_children);
}

TEST(Config, BadValueNamesSettingValueAndAllowedValues) {
  auto c = Load({{"NANHUNT_MODE", "chek"}});
  ASSERT_FALSE(c.ok());
  const std::string msg(c.status().message());
  EXPECT_NE(msg.find("NANHUNT_MODE"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'chek'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("off, check"), std::string::npos) << msg;
}

TEST(Config, NumbersOutOfRangeAreRejected) {
  EXPECT_FALSE(Load({{"NANHUNT_NEAR_MAX", "70000"}}).ok());
  EXPECT_FALSE(Load({{"NANHUNT_NEAR_MAX", "-1"}}).ok());
  EXPECT_FALSE(Load({{"NANHUNT_NEAR_MAX", "abc"}}).ok());
  EXPECT_FALSE(Load({{"NANHUNT_FLUSH_MS", "5"}}).ok());
  EXPECT_FALSE(Load({{"NANHUNT_FOLLOW_CHILDREN", "maybe"}}).ok());
  auto ok = Load({{"NANHUNT_NEAR_MAX", "32768"}, {"NANHUNT_FOLLOW_CHILDREN", "off"}});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->near_max, 32768.0);
  EXPECT_FALSE(ok->follow_children);
}

TEST(Config, MisspeltVariableIsAnErrorNotSilence) {
  auto c = Load({{"NANHUNT_MOD", "off"}});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("unknown setting NANHUNT_MOD"),
            std::string::npos);
}

class ConfigFile : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    // One file per test and process: ctest runs the tests in parallel.
    path_ = ::testing::TempDir() + "/nanhunt_config_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() +
            "_" + std::to_string(getpid()) + ".conf";
    std::ofstream(path_) << text;
    return path_;
  }
  void TearDown() override { std::remove(path_.c_str()); }
  std::string path_;
};

TEST_F(ConfigFile, EntriesApplyAndTheEnvironmentWins) {
  const std::string path = Write(
      "# comment\nnear_max = 8000\nNANHUNT_OUT = /tmp/x  # trailing\n\n");
  auto c = Load({{"NANHUNT_CONFIG", path}, {"NANHUNT_OUT", "/tmp/y"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->near_max, 8000.0);
  EXPECT_EQ(c->out_dir, "/tmp/y");
}

TEST_F(ConfigFile, ErrorsNameFileAndLine) {
  const std::string path = Write("mode = check\nnear_maxx = 1\n");
  auto c = Load({{"NANHUNT_CONFIG", path}});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find(path + ":2"), std::string::npos)
      << c.status();
}

TEST_F(ConfigFile, BadValueInFileNamesFileAndSetting) {
  const std::string path = Write("mode = sometimes\n");
  auto c = Load({{"NANHUNT_CONFIG", path}});
  ASSERT_FALSE(c.ok());
  const std::string msg(c.status().message());
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("NANHUNT_MODE='sometimes'"), std::string::npos) << msg;
}

TEST_F(ConfigFile, PolicyWrittenByAutoIsReadBackAndAddedToTheFp32Ops) {
  const std::string path = Write("");
  ASSERT_TRUE(WritePolicyFile(path, {"aten::bmm", "aten::matmul"},
                              "learned by a test\nsecond line")
                  .ok());
  auto c = Load({{"NANHUNT_POLICY", path}, {"NANHUNT_FP32_OPS", "aten::bmm,auto"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->fp32_auto);
  EXPECT_EQ(c->fp32_ops, (std::vector<std::string>{"aten::bmm", "aten::matmul"}));
  EXPECT_NE(DescribeConfig(*c).find("NANHUNT_FP32_OPS=aten::bmm,aten::matmul,auto"),
            std::string::npos);
}

TEST_F(ConfigFile, BadPolicyLineNamesTheSettingFileAndLine) {
  const std::string path = Write("# header\naten::bmm\nrm -rf /\n");
  auto c = Load({{"NANHUNT_POLICY", path}});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "NANHUNT_POLICY: " + path + ":3: 'rm -rf /' is not an op name; "
            "allowed: one op name or glob per line, e.g. aten::bmm");
}

TEST(Config, MissingPolicyIsAnErrorUnlessAutoIsAboutToWriteIt) {
  auto c = Load({{"NANHUNT_POLICY", "/nonexistent/p.fp32-policy"}});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "NANHUNT_POLICY='/nonexistent/p.fp32-policy' cannot be read; "
            "allowed: path to a policy file written by NANHUNT_FP32_OPS=auto");
  EXPECT_TRUE(Load({{"NANHUNT_POLICY", "/nonexistent/p.fp32-policy"},
                    {"NANHUNT_FP32_OPS", "auto"}})
                  .ok());
}

TEST(Config, SkipNonFiniteStepsIsABoolean) {
  auto c = Load({{"NANHUNT_SKIP_NONFINITE_STEPS", "1"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->skip_nonfinite_steps);
  auto bad = Load({{"NANHUNT_SKIP_NONFINITE_STEPS", "sometimes"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "NANHUNT_SKIP_NONFINITE_STEPS='sometimes' is not valid; allowed: "
            "0 or 1 (also true/false, on/off)");
}

TEST(Config, KernelNamesCanLeaveCuptiToOtherTools) {
  auto fallback = Load({});
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ(fallback->kernel_names, KernelNames::kFirstWarning);
  EXPECT_NE(DescribeConfig(*fallback).find("NANHUNT_KERNEL_NAMES=auto"), std::string::npos);
  auto off = Load({{"NANHUNT_KERNEL_NAMES", "off"}});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->kernel_names, KernelNames::kOff);
  EXPECT_NE(DescribeConfig(*off).find("NANHUNT_KERNEL_NAMES=0"), std::string::npos);
  auto always = Load({{"NANHUNT_KERNEL_NAMES", "1"}});
  ASSERT_TRUE(always.ok()) << always.status();
  EXPECT_EQ(always->kernel_names, KernelNames::kAlways);
  EXPECT_NE(DescribeConfig(*always).find("NANHUNT_KERNEL_NAMES=1"), std::string::npos);
  auto automatic = Load({{"NANHUNT_KERNEL_NAMES", "AUTO"}});
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(automatic->kernel_names, KernelNames::kFirstWarning);
  auto bad = Load({{"NANHUNT_KERNEL_NAMES", "some"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "NANHUNT_KERNEL_NAMES='some' is not valid; allowed: "
            "auto, 1 or 0 (also true/false, on/off)");
}

TEST(Config, GpuBatchHoldsNothingBackUnlessAsked) {
  auto fallback = Load({});
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ(fallback->gpu_batch, 1);
  EXPECT_EQ(DescribeConfig(*fallback).find("NANHUNT_GPU_BATCH"), std::string::npos);
  auto batched = Load({{"NANHUNT_GPU_BATCH", "32"}});
  ASSERT_TRUE(batched.ok()) << batched.status();
  EXPECT_EQ(batched->gpu_batch, 32);
  EXPECT_NE(DescribeConfig(*batched).find("NANHUNT_GPU_BATCH=32"), std::string::npos);
  auto automatic = Load({{"NANHUNT_GPU_BATCH", "Auto"}});
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_TRUE(automatic->gpu_batch_auto);
  EXPECT_EQ(automatic->gpu_batch, 32);
  EXPECT_NE(DescribeConfig(*automatic).find("NANHUNT_GPU_BATCH=auto"), std::string::npos);
  EXPECT_FALSE(batched->gpu_batch_auto);
  for (const char* bad : {"0", "33", "many", "2.5"}) {
    auto c = Load({{"NANHUNT_GPU_BATCH", bad}});
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().message(),
              absl::StrCat("NANHUNT_GPU_BATCH='", bad,
                           "' is not valid; allowed: an integer in [1, 32], or auto"));
  }
}

TEST(Config, MissingFileIsAnError) {
  auto c = Load({{"NANHUNT_CONFIG", "/nonexistent/nanhunt.conf"}});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("NANHUNT_CONFIG"), std::string::npos);
}

TEST(Config, EverySettingIsDocumented) {
  for (const auto& s : AllSettings()) {
    EXPECT_NE(std::string(s.meaning), "") << s.name;
    EXPECT_NE(std::string(s.allowed), "") << s.name;
  }
}

}  // namespace
}  // namespace nanhunt

namespace nanhunt {
namespace {

TEST(Config, Fp32OpsTakesNamesAndGlobs) {
  auto c = Load({{"NANHUNT_FP32_OPS", "aten::bmm, aten::*softmax*"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->fp32_ops, (std::vector<std::string>{"aten::bmm", "aten::*softmax*"}));
  EXPECT_FALSE(c->fp32_auto);
  auto automatic = Load({{"NANHUNT_FP32_OPS", "AUTO"}});
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_TRUE(automatic->fp32_auto);
  EXPECT_TRUE(automatic->fp32_ops.empty());
  auto bad = Load({{"NANHUNT_FP32_OPS", "aten::bmm;rm -rf"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("NANHUNT_FP32_OPS"), std::string::npos);
  EXPECT_FALSE(Load({{"NANHUNT_FP32_OPS", " , "}}).ok());
  EXPECT_FALSE(Load({{"NANHUNT_AUTOCAST_DTYPE", "fp8"}}).ok());
  EXPECT_FALSE(Load({{"NANHUNT_ON_NONFINITE", "explode"}}).ok());
}

}  // namespace
}  // namespace nanhunt
