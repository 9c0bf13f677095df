#!/usr/bin/env python3
"""Self-test of check_deps.py: it runs the checker on small synthetic trees in a temp dir.

An allowed tree must pass; each broken variant (upward edge, sideways edge, file include
cycle, module cycle, an include relative to the file's folder that climbs into another
module, an offline tool linking mc_train, a link line naming libmpi) must fail with the
expected message.  Python 3 standard library only.
"""

import os
import subprocess
import sys
import tempfile
import unittest

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_deps.py")

CMAKELISTS = """\
mc_module(mc_util SOURCES ${X} LINK m)
mc_module(mc_core SOURCES ${X} LINK mc_util)
mc_module(mc_ckpt SOURCES ${X} LINK mc_core hdf5::hdf5)
mc_module(mc_kernels SOURCES ${X} LINK mc_util)
target_link_libraries(mc_kernels PUBLIC CUDA::cudart_static)
mc_module(mc_comm SOURCES ${X} LINK mc_core MPI::MPI_C)
mc_module(mc_train SOURCES ${X} LINK mc_core mc_ckpt mc_kernels mc_comm)
mc_module(mc_plan SOURCES ${X} LINK mc_core)  # mc_train in a comment does not count
mc_module(mc_reshard SOURCES ${X} LINK mc_ckpt)
"""

# The allowed tree: one file per module, every edge in the table, a few same-module and
# folder-relative includes, a commented-out bad include, a generated header.
ALLOWED_TREE = {
    "CMakeLists.txt": CMAKELISTS,
    "util/error.h": "#pragma once\n#include <stdio.h>\n",
    "core/config.h": '#pragma once\n#include "util/error.h"\n',
    "core/config.c": '#include "core/config.h"\n#include "mc_default_config.h"\n',
    "core/families.c": '#include "core/config.h"\n// #include "ckpt/checkpoint.h"\n'
                       '/* #include "train/net.h"\n */\n',
    "ckpt/checkpoint.h": '#pragma once\n#include "core/config.h"\n',
    "ckpt/ckpt_internal.h": '#pragma once\n#include "checkpoint.h"\n',
    "kernels/ops.h": '#pragma once\n#include "util/error.h"\n',
    "kernels/cuda/cuda_common.h": '#pragma once\n#include "kernels/ops.h"\n',
    "kernels/cuda/cuda_gemm.cu": '#include "cuda_common.h"\n#include <cuda_runtime.h>\n',
    "comm/comm.h": '#pragma once\n#include "core/config.h"\n',
    "train/net.h": '#pragma once\n#include "kernels/ops.h"\n#include "comm/comm.h"\n'
                   '#include "ckpt/checkpoint.h"\n',
    "plan/plan.h": '#pragma once\n#include "ckpt/checkpoint.h"\n',
    "reshard/reshard.h": '#pragma once\n#include "ckpt/ckpt_internal.h"\n',
    "cli/mctrain.c": '#include "train/net.h"\n',
    "cli/mctrain.cmake": "set(MC_TOOL_LINK mc_train mc_plan)\n",
    "cli/mcplan.c": '#include "plan/plan.h"\n',
    "cli/mcplan.cmake": "set(MC_TOOL_LINK mc_plan)\n",
    "cli/mcaudit.c": '#include "reshard/reshard.h"\n#include "plan/plan.h"\n',
    "cli/mcaudit.cmake": "# mc_train would be wrong here\nset(MC_TOOL_LINK mc_reshard mc_plan)\n",
    "cli/mcreshard.c": '#include "reshard/reshard.h"\n',
    "cli/mcreshard.cmake": "set(MC_TOOL_LINK mc_reshard)\n",
    "tests/check.h": '#pragma once\n#include "train/net.h"\n',
    "tests/train/test_net.c": '#include "../check.h"\n#include "train/net.h"\n',
    "bench/bench_x.c": '#include "train/net.h"\n#include "reshard/reshard.h"\n',
}

GOOD_LINK = ("/usr/bin/cc -O2 CMakeFiles/mcplan.dir/cli/mcplan.c.o -o mcplan libmc_plan.a "
             "libmc_core.a libmc_util.a /usr/lib/x86_64-linux-gnu/libcjson.so.1.7.15 -lm\n")


def write_tree(base, files):
    for rel, text in files.items():
        path = os.path.join(base, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


class CheckDeps(unittest.TestCase):
    def run_checker(self, changes=None, build=None, extra_args=()):
        files = dict(ALLOWED_TREE)
        files.update(changes or {})
        with tempfile.TemporaryDirectory(prefix="mc_deps_") as tmp:
            src = os.path.join(tmp, "src")
            write_tree(src, {k: v for k, v in files.items() if v is not None})
            args = [sys.executable, CHECKER, "--source", src] + list(extra_args)
            if build is not None:
                bdir = os.path.join(tmp, "build")
                write_tree(bdir, build)
                args += ["--build", bdir]
            p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               universal_newlines=True, env={k: v for k, v in os.environ.items()
                                                             if k != "MC_SOURCE_DIR"})
        return p.returncode, p.stdout

    def expect_fail(self, out_rc, *messages):
        rc, out = out_rc
        self.assertEqual(rc, 1, "checker should fail; output:\n" + out)
        for m in messages:
            self.assertIn(m, out, "expected message missing; output:\n" + out)

    def test_allowed_tree_passes(self):
        rc, out = self.run_checker()
        self.assertEqual(rc, 0, out)
        self.assertIn("0 problem(s)", out)

    def test_allowed_tree_with_clean_link_lines_passes(self):
        build = {"CMakeFiles/%s.dir/link.txt" % t: GOOD_LINK.replace("mcplan", t)
                 for t in ("mcplan", "mcaudit", "mcreshard")}
        rc, out = self.run_checker(build=build)
        self.assertEqual(rc, 0, out)

    def test_upward_edge(self):
        self.expect_fail(self.run_checker({
            "core/families.c": '#include "core/config.h"\n#include "ckpt/checkpoint.h"\n'}),
            "core/families.c includes ckpt/checkpoint.h: core may depend only on util "
            "(core/families.c:2, upward edge)")

    def test_upward_edge_from_util(self):
        self.expect_fail(self.run_checker({
            "util/rng.c": '#include "util/error.h"\n#include "core/config.h"\n'}),
            "util/rng.c includes core/config.h: util may depend on no other module")

    def test_sideways_edge(self):
        self.expect_fail(self.run_checker({
            "comm/comm.h": '#pragma once\n#include "core/config.h"\n#include "ckpt/checkpoint.h"\n'}),
            "comm/comm.h includes ckpt/checkpoint.h: comm may depend only on core, util "
            "(comm/comm.h:3, sideways edge)")

    def test_sideways_edge_train_plan(self):
        self.expect_fail(self.run_checker({"train/arena.c": '#include "plan/plan.h"\n'}),
                         "train/arena.c includes plan/plan.h: train may depend only on "
                         "kernels, comm, ckpt, core, util (train/arena.c:1, sideways edge)")

    def test_skip_not_in_table(self):
        # reshard is above kernels but may not use it
        self.expect_fail(self.run_checker({"reshard/x.c": '#include "kernels/ops.h"\n'}),
                         "reshard/x.c includes kernels/ops.h: reshard may depend only on "
                         "ckpt, core, util")

    def test_edge_to_missing_header_still_counts(self):
        self.expect_fail(self.run_checker({"core/x.c": '#include "train/gone.h"\n'}),
                         "core/x.c includes train/gone.h: core may depend only on util")

    def test_relative_include_climbing_out(self):
        self.expect_fail(self.run_checker({
            "kernels/cuda/cuda_attn.cu": '#include "cuda_common.h"\n#include "../../train/net.h"\n'}),
            "kernels/cuda/cuda_attn.cu includes train/net.h: kernels may depend only on core, util")

    def test_module_includes_test_header(self):
        self.expect_fail(self.run_checker({"ckpt/x.c": '#include "tests/check.h"\n'}),
                         "ckpt/x.c includes tests/check.h: ckpt may depend only on core, util")

    def test_offline_tool_includes_trainer(self):
        self.expect_fail(self.run_checker({"cli/mcplan.c": '#include "plan/plan.h"\n#include "train/net.h"\n'}),
                         "cli/mcplan.c includes train/net.h: cli/mcplan may depend only on")

    def test_file_cycle(self):
        self.expect_fail(self.run_checker({
            "util/a.h": '#pragma once\n#include "util/b.h"\n',
            "util/b.h": '#pragma once\n#include "error.h"\n#include "a.h"\n'}),
            "include cycle: util/a.h -> util/b.h -> util/a.h (util/a.h:2, util/b.h:3)")

    def test_file_self_include(self):
        self.expect_fail(self.run_checker({"core/self.h": '#include "self.h"\n'}),
                         "include cycle: core/self.h -> core/self.h")

    def test_file_cycle_in_tests_is_found(self):
        self.expect_fail(self.run_checker({
            "tests/x/a.h": '#include "b.h"\n', "tests/x/b.h": '#include "c.h"\n',
            "tests/x/c.h": '#include "a.h"\n'}),
            "include cycle: tests/x/a.h -> tests/x/b.h -> tests/x/c.h -> tests/x/a.h")

    def test_module_cycle(self):
        self.expect_fail(self.run_checker({
            "comm/comm.h": '#pragma once\n#include "ckpt/checkpoint.h"\n',
            "ckpt/ckpt_internal.h": '#pragma once\n#include "checkpoint.h"\n#include "comm/comm.h"\n'}),
            "module cycle: ckpt -> comm -> ckpt (ckpt/ckpt_internal.h:3 includes comm/comm.h; "
            "comm/comm.h:2 includes ckpt/checkpoint.h)",
            "comm/comm.h includes ckpt/checkpoint.h: comm may depend only on core, util")

    def test_offline_tool_links_trainer(self):
        self.expect_fail(self.run_checker({"cli/mcplan.cmake": "set(MC_TOOL_LINK mc_plan mc_train)\n"}),
                         "cli/mcplan links mc_train (mc_train, cli/mcplan.cmake + CMakeLists.txt)",
                         "cli/mcplan links MPI::MPI_C (mc_train -> mc_comm -> MPI::MPI_C",
                         "cli/mcplan links CUDA::cudart_static (mc_train -> mc_kernels -> CUDA::cudart_static")

    def test_offline_tool_links_mpi_through_library(self):
        self.expect_fail(self.run_checker({
            "CMakeLists.txt": CMAKELISTS.replace("mc_module(mc_plan SOURCES ${X} LINK mc_core)",
                                                 "mc_module(mc_plan SOURCES ${X} LINK mc_core mc_comm)")}),
            "CMakeLists.txt: mc_plan links mc_comm: plan may depend only on ckpt, core, util",
            "cli/mcplan links mc_comm (mc_plan -> mc_comm,",
            "cli/mcaudit links MPI::MPI_C (mc_plan -> mc_comm -> MPI::MPI_C,")

    def test_offline_tool_default_link_is_ok(self):
        rc, out = self.run_checker({"cli/mcreshard.cmake": None})     # default: mc_ckpt
        self.assertEqual(rc, 0, out)

    def test_offline_tool_missing(self):
        files = {"cli/mcaudit.c": None}
        self.expect_fail(self.run_checker(files), "cli/mcaudit.c not found")

    def test_link_line_with_mpi_and_trainer(self):
        build = {"CMakeFiles/%s.dir/link.txt" % t: GOOD_LINK.replace("mcplan", t)
                 for t in ("mcplan", "mcaudit", "mcreshard")}
        build["CMakeFiles/mcreshard.dir/link.txt"] = (
            "/usr/bin/cc x.o -o mcreshard @CMakeFiles/mcreshard.dir/linkLibs.rsp\n")
        build["CMakeFiles/mcreshard.dir/linkLibs.rsp"] = (
            "libmc_reshard.a libmc_train.a /usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so "
            "-lcudart_static\n")
        self.expect_fail(self.run_checker(build=build),
                         "cli/mcreshard links libmc_train.a (CMakeFiles/mcreshard.dir/link.txt)",
                         "cli/mcreshard links /usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so",
                         "cli/mcreshard links -lcudart_static")

    def test_print_table(self):
        p = subprocess.run([sys.executable, CHECKER, "--print"], stdout=subprocess.PIPE,
                           universal_newlines=True)
        self.assertEqual(p.returncode, 0)
        lines = {l.split()[0]: l.split(None, 1)[1] for l in p.stdout.splitlines()[1:]}
        self.assertEqual(lines["util"], "(nothing)")
        self.assertEqual(lines["core"], "util")
        self.assertEqual(lines["reshard"], "ckpt, core, util")


if __name__ == "__main__":
    unittest.main(verbosity=2)
