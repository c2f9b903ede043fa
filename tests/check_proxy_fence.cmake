# ctest: a kernel whose threads write shared memory (cp.async: LDGSTS, or plain stores: STS) that its
# wgmmas (HGMMA) then read must fence the async proxy (fence.proxy.async: FENCE.VIEW.ASYNC.S in SASS).
# The harness cannot catch the fence's absence: on the H100 such a kernel gave right answers on every
# case (the proxy_fence_missing mutant passed all of them), yet the PTX memory model does not promise
# that wgmma sees the writes. So the rule is checked on the machine code the GPU runs.
#
#   cmake -DCUOBJDUMP=path -DOBJECTS="a.o|b.o..." -P check_proxy_fence.cmake
string(REPLACE "|" ";" OBJECTS "${OBJECTS}")
if(NOT OBJECTS)
  message(FATAL_ERROR "check_proxy_fence.cmake: OBJECTS names no object file")
endif()
set(missing "")
set(checked 0)
foreach(object IN LISTS OBJECTS)
  execute_process(COMMAND ${CUOBJDUMP} -sass ${object} OUTPUT_VARIABLE sass RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "cuobjdump -sass ${object} failed (${status})")
  endif()
  # One section per kernel: "Function : <mangled name>" up to the next one. Every SASS line ends in
  # ';' and addresses sit in brackets, both special in a CMake list: they go first.
  string(REGEX REPLACE "[][;]" " " sass "${sass}")
  string(REPLACE "Function : " ";Function : " sections "${sass}")
  foreach(section IN LISTS sections)
    if(NOT section MATCHES "^Function : ([A-Za-z0-9_]+)")
      continue()
    endif()
    set(kernel "${CMAKE_MATCH_1}")
    # Step 25's only thread store to shared memory is the scheduler's next tile index, which threads read; its
    # wgmmas read only tiles the copy engine wrote. (Before the SYNCS rule below, the fence ptxas places at the
    # mbarrier inits let this kernel pass; now it is named.)
    if(kernel MATCHES "persistent_grid_kernel")
      continue()
    endif()
    if(section MATCHES "HGMMA" AND section MATCHES "(LDGSTS|[ \t]STS[. ])")
      math(EXPR checked "${checked} + 1")
      # ptxas puts a FENCE.VIEW.ASYNC.S of its own just before the mbarrier inits (SYNCS.EXCH): that one does
      # not count. (Only addresses, encodings and blanks lie between the two: no capital letter.)
      string(REGEX REPLACE "FENCE\\.VIEW\\.ASYNC\\.S[^A-Z]*SYNCS\\.EXCH" "SYNCS.EXCH" section "${section}")
      if(NOT section MATCHES "FENCE\\.VIEW\\.ASYNC\\.S")
        string(APPEND missing "\n  ${kernel} (${object})")
      endif()
    endif()
  endforeach()
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "no kernel in ${OBJECTS} has both thread-written shared memory and wgmma: nothing was checked")
endif()
if(missing)
  message(FATAL_ERROR "threads write shared memory that wgmma reads, with no fence.proxy.async:${missing}")
endif()
message(STATUS "${checked} kernel(s) write wgmma's shared memory from threads, each with fence.proxy.async")
