// SPDX-License-Identifier: Apache-2.0
// A manifest encoded, its JSON edited, and decoded again: the error decode_manifest gives the
// edited text (a test of a hostile manifest fails if the edit is accepted).
#pragma once

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <functional>
#include <string>

#include "ckpt/core/error.hpp"
#include "ckpt/format/manifest.hpp"

namespace ckpt::test {

inline Error manifest_decode_error(const Manifest& m, const std::function<void(boost::json::object&)>& edit, const std::string& file) {
  boost::json::value v = boost::json::parse(encode_manifest(m));
  edit(v.as_object());
  try {
    decode_manifest(boost::json::serialize(v), file);
  } catch (const Error& e) {
    return e;
  }
  FAIL("accepted " << boost::json::serialize(v));
  return Error(Errc::aborted, "", "");
}

}  // namespace ckpt::test
