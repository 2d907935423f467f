# Sourced by the browser tests: sets `chromium` to a headless-capable Chrome/Chromium binary
# ($CHROMIUM, chromium, chromium-browser, google-chrome, google-chrome-stable), or prints how to
# install one and exits 1 (a missing browser fails the test rather than skipping it, so that CI
# notices).
chromium=""
for candidate in "${CHROMIUM:-}" chromium chromium-browser google-chrome google-chrome-stable; do
  if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1; then
    chromium="$candidate"
    break
  fi
done
if [ -z "$chromium" ]; then
  echo "FAIL: no Chromium found (tried \$CHROMIUM, chromium, chromium-browser, google-chrome)."
  echo "      Install it with: sudo apt-get install chromium   (Debian/Ubuntu; scripts/setup.sh)"
  echo "      or point CHROMIUM at a Chrome/Chromium binary."
  exit 1
fi
