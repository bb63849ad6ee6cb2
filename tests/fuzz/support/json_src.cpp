// SPDX-License-Identifier: Apache-2.0
// Boost.JSON compiled from source into the fuzz build (instead of linking libboost_json), so
// that its parser is instrumented and the fuzzer's coverage feedback reaches into it.
#include <boost/json/src.hpp>
