# The Python binding's tests (tests/python, pytest) and examples, registered when the SWIG module
# is built (-DKVARN_BUILD_PYTHON=ON; .ci/run passes it with the Python of its virtual
# environment, which has numpy, pytest and ml_dtypes). One CTest test per pytest file; label
# "python". They import the package from the build tree (bindings/python/kvarn).
if(TARGET kvarn_python)
  get_target_property(_kvarn_py_pkg kvarn_python LIBRARY_OUTPUT_DIRECTORY)
  get_filename_component(_kvarn_py_path ${_kvarn_py_pkg} DIRECTORY)
  set(_kvarn_py_env
    "PYTHONPATH=${_kvarn_py_path}"
    "KVARN_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
    "PYTHONDONTWRITEBYTECODE=1")
  # An ASan build (the cpu-asan job of tests/reliability_ci.sh): the interpreter is not
  # instrumented, so the runtime is preloaded; the interpreter's own allocations are not leaks
  # of ours, and the out-of-memory tests ask for sizes ASan would otherwise abort on.
  if(CMAKE_CXX_FLAGS MATCHES "-fsanitize=[^ ]*address")
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libasan.so
                    OUTPUT_VARIABLE _kvarn_asan_runtime OUTPUT_STRIP_TRAILING_WHITESPACE)
    list(APPEND _kvarn_py_env "LD_PRELOAD=${_kvarn_asan_runtime}"
         "ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1")
  endif()

  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import numpy, pytest"
                  RESULT_VARIABLE _kvarn_py_missing OUTPUT_QUIET ERROR_QUIET)
  if(_kvarn_py_missing)
    message(WARNING "kvarn python tests: ${Python3_EXECUTABLE} lacks numpy or pytest; the "
                    "python.* tests will fail (install them, e.g. in a venv as .ci/run does)")
  endif()

  file(GLOB _kvarn_py_tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/python/test_*.py)
  foreach(_file IN LISTS _kvarn_py_tests)
    get_filename_component(_stem ${_file} NAME_WE)
    string(REGEX REPLACE "^test_" "" _name ${_stem})
    add_test(NAME python.${_name}
             COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider -rs ${_file}
             WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/python)
    # pytest exits with 5 when nothing ran (every test skipped, e.g. the GPU file without a
    # GPU): CTest reports that as skipped, not passed or failed.
    set_tests_properties(python.${_name} PROPERTIES
      ENVIRONMENT "${_kvarn_py_env}" LABELS python TIMEOUT 300 SKIP_RETURN_CODE 5)
  endforeach()

  add_test(NAME example.python.codec
           COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/examples/python/codec.py)
  set_tests_properties(example.python.codec PROPERTIES
    ENVIRONMENT "${_kvarn_py_env}" LABELS "example;python" TIMEOUT 120)

  # README.md's Python start (examples/readme, verbatim in README: docs.readme_snippets).
  add_test(NAME example.readme.python
           COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/examples/readme/start.py)
  set_tests_properties(example.readme.python PROPERTIES
    ENVIRONMENT "${_kvarn_py_env}" LABELS "example;python" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "x smaller")

  # The capturable paged layer: an engine's decode loop (numpy on the CPU), self-checking; with
  # torch and a CUDA device also captured in a CUDA graph (`--device cuda`, exits 77 = skipped
  # where either is missing).
  add_test(NAME example.python.paged_decode
           COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/examples/python/paged_decode.py)
  set_tests_properties(example.python.paged_decode PROPERTIES
    ENVIRONMENT "${_kvarn_py_env}" LABELS "example;python" TIMEOUT 300)
  if(KVARN_ENABLE_CUDA)
    add_test(NAME example.python.paged_decode.cuda
             COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/examples/python/paged_decode.py
                     --device cuda)
    set_tests_properties(example.python.paged_decode.cuda PROPERTIES
      ENVIRONMENT "${_kvarn_py_env}" LABELS "example;python;gpu" TIMEOUT 300
      SKIP_RETURN_CODE 77)
  endif()

  # Packaging (the wheel as a user builds and installs it) is not a CTest test: it builds the
  # library once more in pip, so .ci/run runs it once, as scripts/wheel-ci.sh.
endif()
