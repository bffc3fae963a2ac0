# The Java binding's JUnit 5 suites (bindings/java/src/test/java) and example (examples/java),
# registered when kvarn.jar is built (-DKVARN_BUILD_JAVA=ON; .ci/run passes it). They run through
# Debian's junit5 console launcher; label "java".
#   java.junit             every suite, loading the native library from the jar (the fallback)
#   java.junit.librarypath the loader's first way: System.loadLibrary from java.library.path
#   java.selftest          java -jar kvarn.jar (version, backends, selftest of every preset)
#   java.javadoc           javadoc of io.kvarn with doclint, warnings as errors
#   example.java.decode    examples/java/DecodeLoop.java
if(TARGET kvarn_java)
  find_package(Java 11 REQUIRED COMPONENTS Runtime Development)
  include(UseJava)
  get_target_property(_kvarn_jar kvarn_java JAR_FILE)
  get_target_property(_kvarn_jni_dir kvarn_jni LIBRARY_OUTPUT_DIRECTORY)

  find_jar(KVARN_JUNIT_CONSOLE NAMES junit-platform-console-standalone
           PATHS /usr/share/java DOC "JUnit 5 console launcher (Debian package junit5)")
  if(KVARN_JUNIT_CONSOLE)
    file(GLOB_RECURSE _kvarn_java_tests CONFIGURE_DEPENDS
         ${PROJECT_SOURCE_DIR}/bindings/java/src/test/java/*.java)
    set(CMAKE_JAVA_COMPILE_FLAGS -encoding UTF-8 --release 11 -Xlint:all,-serial,-options -Werror)
    add_jar(kvarn_java_tests
      SOURCES ${_kvarn_java_tests}
      INCLUDE_JARS kvarn_java ${KVARN_JUNIT_CONSOLE}
      OUTPUT_NAME kvarn-tests
      OUTPUT_DIR ${CMAKE_CURRENT_BINARY_DIR}/java)
    unset(CMAKE_JAVA_COMPILE_FLAGS)
    get_target_property(_kvarn_test_jar kvarn_java_tests JAR_FILE)
    set(_kvarn_junit ${Java_JAVA_EXECUTABLE} -Xcheck:jni)
    set(_kvarn_junit_args -jar ${KVARN_JUNIT_CONSOLE} --disable-banner --details=summary
        --fail-if-no-tests --class-path ${_kvarn_jar}:${_kvarn_test_jar}
        --scan-class-path ${_kvarn_test_jar})
    add_test(NAME java.junit
             COMMAND ${_kvarn_junit} -Dkvarn.test.expectSource=jar: ${_kvarn_junit_args})
    add_test(NAME java.junit.librarypath
             COMMAND ${_kvarn_junit} -Djava.library.path=${_kvarn_jni_dir}
                     -Dkvarn.test.expectSource=java.library.path ${_kvarn_junit_args}
                     --include-classname io[.]kvarn[.]KvarnTest)
    set_tests_properties(java.junit java.junit.librarypath PROPERTIES
      LABELS java TIMEOUT 600)
  else()
    message(WARNING "kvarn java: the JUnit 5 console launcher (Debian package junit5) was not "
                    "found; the java.junit tests are not registered")
  endif()

  add_test(NAME java.selftest COMMAND ${Java_JAVA_EXECUTABLE} -jar ${_kvarn_jar})
  set_tests_properties(java.selftest PROPERTIES
    LABELS java TIMEOUT 300 PASS_REGULAR_EXPRESSION "[1-9][0-9]* passed, 0 failed")

  add_test(NAME java.javadoc COMMAND ${KVARN_JAVA_JAVADOC_COMMAND})
  set_tests_properties(java.javadoc PROPERTIES LABELS java TIMEOUT 300)

  if(KVARN_BUILD_EXAMPLES)
    set(CMAKE_JAVA_COMPILE_FLAGS -encoding UTF-8 --release 11 -Xlint:all -Werror)
    add_jar(kvarn_example_java
      SOURCES ${PROJECT_SOURCE_DIR}/examples/java/DecodeLoop.java
      INCLUDE_JARS kvarn_java
      ENTRY_POINT DecodeLoop
      OUTPUT_NAME decode-loop
      OUTPUT_DIR ${CMAKE_CURRENT_BINARY_DIR}/java)
    unset(CMAKE_JAVA_COMPILE_FLAGS)
    get_target_property(_kvarn_example_jar kvarn_example_java JAR_FILE)
    add_test(NAME example.java.decode
             COMMAND ${Java_JAVA_EXECUTABLE} -cp ${_kvarn_jar}:${_kvarn_example_jar} DecodeLoop)
    set_tests_properties(example.java.decode PROPERTIES LABELS "example;java" TIMEOUT 300)

    # README.md's Java start (examples/readme, verbatim in README: docs.readme_snippets); the
    # README keeps its short form (wildcard imports), so without -Xlint.
    set(CMAKE_JAVA_COMPILE_FLAGS -encoding UTF-8 --release 11 -Werror)
    add_jar(kvarn_example_readme_java
      SOURCES ${PROJECT_SOURCE_DIR}/examples/readme/Start.java
      INCLUDE_JARS kvarn_java
      ENTRY_POINT Start
      OUTPUT_NAME readme-start
      OUTPUT_DIR ${CMAKE_CURRENT_BINARY_DIR}/java)
    unset(CMAKE_JAVA_COMPILE_FLAGS)
    get_target_property(_kvarn_readme_jar kvarn_example_readme_java JAR_FILE)
    add_test(NAME example.readme.java
             COMMAND ${Java_JAVA_EXECUTABLE} -cp ${_kvarn_jar}:${_kvarn_readme_jar} Start)
    set_tests_properties(example.readme.java PROPERTIES
      LABELS "example;java" TIMEOUT 300 PASS_REGULAR_EXPRESSION "x smaller")
  endif()
endif()
