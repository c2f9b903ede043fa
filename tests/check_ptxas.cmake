# ctest: fails when ptxas reported that it serialized a Hopper step's wgmmas. ptxas says so only as
# an "info" message (C7510-C7520: "Potential Performance Loss: wgmma.mma_async instructions are
# serialized due to ..."), and the build succeeds anyway; a serialized wgmma runs correctly but each
# one waits for the last, which throws away what the asynchronous steps teach. The messages come from
# the logs tests/ptxas_log.sh keeps of every Hopper step's compilation.
#
#   cmake -DLOG_DIRS="dir|dir..." -P check_ptxas.cmake    (one folder of logs per step)
string(REPLACE "|" ";" LOG_DIRS "${LOG_DIRS}")
if(NOT LOG_DIRS)
  message(FATAL_ERROR "check_ptxas.cmake: LOG_DIRS names no folder of ptxas logs")
endif()
set(serialized "")
foreach(dir IN LISTS LOG_DIRS)
  file(GLOB logs "${dir}/*.log")
  if(NOT logs)
    message(FATAL_ERROR "no ptxas log in ${dir}: build the project first (the logs are written as it compiles)")
  endif()
  foreach(log IN LISTS logs)
    file(STRINGS "${log}" lines REGEX "C75(1[0-9]|20)")
    foreach(line IN LISTS lines)
      string(APPEND serialized "\n  ${log}:\n    ${line}")
    endforeach()
  endforeach()
  list(LENGTH logs count)
  message(STATUS "${dir}: ${count} object(s) checked")
endforeach()
if(serialized)
  message(FATAL_ERROR "ptxas serialized wgmma instructions:${serialized}")
endif()
message(STATUS "no wgmma serialized")
