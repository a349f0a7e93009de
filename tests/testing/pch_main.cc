// The owner of the tests' precompiled header (tests/CMakeLists.txt): an
// executable built as a test is, never run.
int main() { return 0; }
