#!/usr/bin/env bash
# Regenerate the console screenshots in this folder: the browser tests take them
# (tests/console/test_browser.py, test_reports_pages.py, test_pipelines_page.py) and copy them here when asked to.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../.."
WAYMARK_CONSOLE_SCREENSHOTS="$here" ./run test tests/console/test_browser.py tests/console/test_reports_pages.py tests/console/test_pipelines_page.py -q
