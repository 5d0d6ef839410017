# Writes OUTPUT: a C++ source defining tile::cuda::device_source() with INPUT's text.
file(READ ${INPUT} text)
set(delim "tile_device_code")
file(WRITE ${OUTPUT}
  "// Generated from ${INPUT}; do not edit.\n"
  "#include <string_view>\n"
  "namespace tile::cuda {\n"
  "std::string_view device_source() {\n"
  "  static constexpr char text[] = R\"${delim}(${text})${delim}\";\n"
  "  return {text, sizeof(text) - 1};\n"
  "}\n"
  "}  // namespace tile::cuda\n")
