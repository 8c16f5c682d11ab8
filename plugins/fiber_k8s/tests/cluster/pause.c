/* The pod sandbox ("pause") container: sleep until told to stop. Built statically and
 * imported into docker by up.sh, because there is no registry to pull the real one. */
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/wait.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
    signal(SIGINT, stop);
    signal(SIGTERM, stop);
    signal(SIGCHLD, reap);
    for (;;) pause();
}
