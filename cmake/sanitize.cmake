# Sanitizer and fuzzing flags (issue #10). Included by the top CMakeLists.txt before any target.
#
# CEDAR_SANITIZE=ON: every library, test, example and program is compiled and linked with
#   AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer comes with ASan). UB is fatal
#   (-fno-sanitize-recover=undefined) so ctest sees it as a failure, not a log line. -O1 keeps
#   the build and the tests fast enough for CI while leaving stack traces readable.
# CEDAR_FUZZ=ON (clang only): also instruments every library for libFuzzer's coverage feedback
#   (-fsanitize=fuzzer-no-link) and adds the targets of tests/fuzz/ (linked with
#   -fsanitize=fuzzer, which supplies main()). Fuzzing without ASan/UBSan finds little, so
#   CEDAR_FUZZ turns CEDAR_SANITIZE on.
if(CEDAR_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "CEDAR_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++ "
                        "-DCMAKE_C_COMPILER=clang (got ${CMAKE_CXX_COMPILER_ID})")
  endif()
  if(NOT CEDAR_SANITIZE)
    message(STATUS "cedar: CEDAR_FUZZ turns CEDAR_SANITIZE on")
    set(CEDAR_SANITIZE ON CACHE BOOL "Build everything with AddressSanitizer + UBSan" FORCE)
  endif()
endif()

if(CEDAR_SANITIZE)
  set(cedar_sanitize_flags -fsanitize=address,undefined -fno-sanitize-recover=undefined
                           -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:${cedar_sanitize_flags};-O1;-g>")
  add_link_options(-fsanitize=address,undefined)
  message(STATUS "cedar: ASan + UBSan build (-O1 -g)")
endif()

if(CEDAR_FUZZ)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=fuzzer-no-link>)
endif()
