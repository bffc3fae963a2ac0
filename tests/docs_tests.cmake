# Documentation checks. Included by tests/CMakeLists.txt. Label: "docs".
# docs.readme_snippets: README.md's C, Python, Java and Rust blocks are examples/readme/'s files,
# which the example.readme.* tests build and run.
# docs.self_contained: no tracked file cites design files outside the repository (issue 16); the
# algorithm and byte format are specified in docs/FORMAT.md. Needs bash and git; without a git
# work tree (a source tarball) the script exits 77 and the test is reported as skipped.
find_program(KVARN_BASH NAMES bash)
if(KVARN_BASH)
  add_test(NAME docs.self_contained
           COMMAND ${KVARN_BASH} ${PROJECT_SOURCE_DIR}/scripts/check-doc-references.sh
                   ${PROJECT_SOURCE_DIR})
  set_tests_properties(docs.self_contained PROPERTIES LABELS docs SKIP_RETURN_CODE 77)
  add_test(NAME docs.readme_snippets
           COMMAND ${KVARN_BASH} ${PROJECT_SOURCE_DIR}/scripts/check-readme-snippets.sh
                   ${PROJECT_SOURCE_DIR})
  set_tests_properties(docs.readme_snippets PROPERTIES LABELS docs)
endif()
