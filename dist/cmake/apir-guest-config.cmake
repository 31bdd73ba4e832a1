# find_package(apir-guest): apir's guest library, libggml-apir.so.
#   apir::ggml-apir           imported target (links ggml_backend_init/_score)
#   APIR_GUEST_BACKEND_PATH   the file to name in GGML_BACKEND_PATH
# Found relative to this file (LIBDIR/cmake/apir-guest/), so a moved prefix
# stays valid.
get_filename_component(_apir_guest_libdir "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
set(APIR_GUEST_BACKEND_PATH "${_apir_guest_libdir}/libggml-apir.so")
if(NOT EXISTS "${APIR_GUEST_BACKEND_PATH}")
  set(apir-guest_FOUND FALSE)
  set(apir-guest_NOT_FOUND_MESSAGE "libggml-apir.so is not at ${APIR_GUEST_BACKEND_PATH}")
  return()
endif()
if(NOT TARGET apir::ggml-apir)
  add_library(apir::ggml-apir SHARED IMPORTED)
  set_target_properties(apir::ggml-apir PROPERTIES IMPORTED_LOCATION "${APIR_GUEST_BACKEND_PATH}")
endif()
unset(_apir_guest_libdir)
