from kerneljudge.cli import main

main()
