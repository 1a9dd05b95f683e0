// Renders a study JSON file to the HTML report with study/study_report.h,
// for the headless-Chromium test until `kvq study --report` exists (and for
// re-rendering a saved study.json by hand).
//
//   render_study_report STUDY.json OUT.html
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "study/study_report.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: render_study_report STUDY.json OUT.html\n";
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) {
    std::cerr << argv[1] << ": cannot open\n";
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json study =
      nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (study.is_discarded()) {
    std::cerr << argv[1] << ": not valid JSON\n";
    return 1;
  }
  const kvq::Status status = kvq::WriteStudyReport(study, argv[2]);
  if (!status.ok()) {
    std::cerr << argv[1] << ": " << status.message() << "\n";
    return 1;
  }
  return 0;
}
