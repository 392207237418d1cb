# Obtains llama.cpp's source from the pinned llama-cpp-python sdist (through pip, cached)
# and applies patches/*.patch to it. Sets OUT_VAR to the patched source directory.

function(kvgguf_cache_dir out_var)
    if (DEFINED ENV{KVGGUF_CACHE_DIR})
        set(dir "$ENV{KVGGUF_CACHE_DIR}")
    elseif (DEFINED ENV{XDG_CACHE_HOME})
        set(dir "$ENV{XDG_CACHE_HOME}/kvgguf")
    else()
        set(dir "$ENV{HOME}/.cache/kvgguf")
    endif()
    set(${out_var} "${dir}" PARENT_SCOPE)
endfunction()

function(kvgguf_fetch_sdist out_var)
    set(version "${KVGGUF_LLAMA_CPP_PYTHON_VERSION}")
    if (DEFINED ENV{KVGGUF_LLAMA_SDIST})
        set(${out_var} "$ENV{KVGGUF_LLAMA_SDIST}" PARENT_SCOPE)
        return()
    endif()
    kvgguf_cache_dir(cache)
    set(sdist "${cache}/sdist/llama_cpp_python-${version}.tar.gz")
    if (NOT EXISTS "${sdist}")
        if (NOT Python_EXECUTABLE)
            find_package(Python REQUIRED COMPONENTS Interpreter)
        endif()
        message(STATUS "kvgguf: asking pip for the llama-cpp-python ${version} sdist (cached in ${cache}/sdist)")
        # Download into a scratch folder first so an interrupted download never looks cached.
        set(scratch "${cache}/sdist/.download")
        file(REMOVE_RECURSE "${scratch}")
        execute_process(
            COMMAND "${Python_EXECUTABLE}" -m pip download --no-deps --no-binary llama-cpp-python
                    "llama-cpp-python==${version}" -d "${scratch}"
            RESULT_VARIABLE rc)
        set(got "${scratch}/llama_cpp_python-${version}.tar.gz")
        if (NOT rc EQUAL 0 OR NOT EXISTS "${got}")
            message(FATAL_ERROR "kvgguf: could not obtain the llama-cpp-python ${version} sdist with pip "
                                "(exit ${rc}). Set KVGGUF_LLAMA_SDIST to a local copy to build offline.")
        endif()
        file(RENAME "${got}" "${sdist}")
        file(REMOVE_RECURSE "${scratch}")
    endif()
    set(${out_var} "${sdist}" PARENT_SCOPE)
endfunction()

function(kvgguf_prepare_llama_source out_var)
    kvgguf_fetch_sdist(sdist)
    file(GLOB patches "${CMAKE_CURRENT_SOURCE_DIR}/patches/*.patch")
    list(SORT patches)
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${patches})

    # The stamp names the sdist and every patch's content: any change re-extracts cleanly.
    set(stamp_text "${KVGGUF_LLAMA_CPP_PYTHON_VERSION}")
    foreach(p ${patches})
        file(SHA256 "${p}" h)
        string(APPEND stamp_text ";${h}")
    endforeach()
    string(SHA256 stamp "${stamp_text}")

    set(root "${CMAKE_BINARY_DIR}/llama-src")
    set(src "${root}/llama_cpp_python-${KVGGUF_LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp")
    set(stamp_file "${root}/kvgguf.stamp")
    set(old_stamp "")
    if (EXISTS "${stamp_file}")
        file(READ "${stamp_file}" old_stamp)
    endif()

    if (NOT old_stamp STREQUAL stamp)
        message(STATUS "kvgguf: extracting llama.cpp from ${sdist}")
        file(REMOVE_RECURSE "${root}")
        file(ARCHIVE_EXTRACT INPUT "${sdist}" DESTINATION "${root}"
             PATTERNS "llama_cpp_python-${KVGGUF_LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp")
        if (NOT EXISTS "${src}/CMakeLists.txt")
            message(FATAL_ERROR "kvgguf: ${sdist} holds no vendor/llama.cpp; is it a llama-cpp-python sdist?")
        endif()
        # The vendored tree carries a submodule's .git file; a private repository lets
        # `git apply` work relative to llama.cpp's root wherever the build folder lives.
        file(REMOVE "${src}/.git")
        find_program(GIT git REQUIRED)
        execute_process(COMMAND "${GIT}" init -q WORKING_DIRECTORY "${src}" RESULT_VARIABLE rc)
        foreach(p ${patches})
            message(STATUS "kvgguf: applying ${p}")
            execute_process(COMMAND "${GIT}" apply --whitespace=nowarn "${p}"
                            WORKING_DIRECTORY "${src}" RESULT_VARIABLE rc)
            if (NOT rc EQUAL 0)
                message(FATAL_ERROR "kvgguf: patch ${p} does not apply to llama-cpp-python "
                                    "${KVGGUF_LLAMA_CPP_PYTHON_VERSION}'s llama.cpp")
            endif()
        endforeach()
        file(WRITE "${stamp_file}" "${stamp}")
    endif()
    set(${out_var} "${src}" PARENT_SCOPE)
endfunction()
