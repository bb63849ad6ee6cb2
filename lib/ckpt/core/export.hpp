// SPDX-License-Identifier: Apache-2.0
// What a shared libckpt.so exports. The library is compiled with hidden visibility
// (-fvisibility=hidden), so that the template instantiations it makes of its private
// dependencies (Asio, Boost.JSON, ...) stay inside it; every ckpt header brackets its
// declarations with CKPT_API_BEGIN / CKPT_API_END, which gives what it declares (classes with
// their vtables and type information, functions, variables) default visibility again. A
// static libckpt.a is unaffected. Includes stay outside the brackets, so nothing of another
// library is exported through them.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define CKPT_API_BEGIN _Pragma("GCC visibility push(default)")
#define CKPT_API_END _Pragma("GCC visibility pop")
#else
#define CKPT_API_BEGIN
#define CKPT_API_END
#endif
