# cmake -DROOT=<repo> -DOUTPUT=<header> -DFALLBACK=<sha> -P git_commit.cmake
# Writes TILE_GIT_COMMIT / TILE_GIT_DIRTY for tile.build_info(), run on every build; the header
# is rewritten only when they change. A FALLBACK given wins over git: a tree copied to another
# machine may carry a .git of some older commit, and the caller who copied it knows which
# commit the files are. Without either, the commit is empty.
set(commit "${FALLBACK}")
set(dirty 0)
find_package(Git QUIET)
if(GIT_FOUND AND commit STREQUAL "")
  execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${ROOT}" rev-parse HEAD
                  OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE result)
  if(result EQUAL 0)
    set(commit "${head}")
    execute_process(COMMAND "${GIT_EXECUTABLE}" --no-optional-locks -C "${ROOT}" status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE changes ERROR_QUIET)
    if(NOT changes STREQUAL "")
      set(dirty 1)
    endif()
  endif()
endif()
file(WRITE "${OUTPUT}.tmp" "#define TILE_GIT_COMMIT \"${commit}\"\n#define TILE_GIT_DIRTY ${dirty}\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
