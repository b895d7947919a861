// kvshift: the command-line entry point. Subcommands live in src/cli/commands/.
#include <cstdio>

int main(int argc, char** argv) {
  std::fprintf(stderr, "kvshift: skeleton\n");
  return 1;
}
