#include "core/torch_release.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace nanhunt {
namespace {

TEST(SameTorchRelease, MajorAndMinorDecide) {
  EXPECT_TRUE(SameTorchRelease("2.15.0", "2.15.0+cu132"));
  EXPECT_TRUE(SameTorchRelease("2.15.0", "2.15.1"));
  EXPECT_TRUE(SameTorchRelease("2.4.0", "2.4.0a0+git1234abc"));
  EXPECT_TRUE(SameTorchRelease("2.7.1", "2.7+cpu"));
  EXPECT_FALSE(SameTorchRelease("2.15.0", "2.14.1"));
  EXPECT_FALSE(SameTorchRelease("2.1.0", "2.15.0"));  // not a prefix match
  EXPECT_FALSE(SameTorchRelease("2.15.0", "3.15.0"));
  EXPECT_FALSE(SameTorchRelease("2.15.0", ""));
  EXPECT_FALSE(SameTorchRelease("2.15.0", "nightly"));
}

class TorchReleaseBesideTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/nanhunt_release_XXXXXX";
    root_ = mkdtemp(pattern);
    std::filesystem::create_directories(root_ + "/torch/lib");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(root_ + "/torch/" + name) << text;
  }
  std::string Lib() const { return root_ + "/torch/lib"; }
  std::string root_;
};

TEST_F(TorchReleaseBesideTest, ReadsAWheelsVersionPy) {
  Write("version.py",
        "from typing import Optional\n\n__all__ = ['__version__']\n"
        "__version__ = '2.15.0+cu132'\ndebug = False\ncuda: Optional[str] = '13.2'\n");
  EXPECT_EQ(TorchReleaseBeside(Lib()), "2.15.0+cu132");
}

TEST_F(TorchReleaseBesideTest, ReadsDoubleQuotes) {
  Write("version.py", "__version__ = \"2.7.1\"\n");
  EXPECT_EQ(TorchReleaseBeside(Lib()), "2.7.1");
}

TEST_F(TorchReleaseBesideTest, ReadsTheLibTorchArchivesBuildVersion) {
  Write("build-version", "2.6.0+cu124\n");
  EXPECT_EQ(TorchReleaseBeside(Lib()), "2.6.0+cu124");
}

TEST_F(TorchReleaseBesideTest, SaysNothingWhenNothingSays) {
  EXPECT_EQ(TorchReleaseBeside(Lib()), "");
  Write("version.py", "# __version__ is set elsewhere\nversion = '2.15.0'\n");
  EXPECT_EQ(TorchReleaseBeside(Lib()), "");
  EXPECT_EQ(TorchReleaseBeside(""), "");
}

}  // namespace
}  // namespace nanhunt
