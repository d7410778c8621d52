# parasol compare: best predicted iteration time against search time.
$a0 << EOD
0.001748 446.649429
4.756741 446.649429

EOD
$a1 << EOD
0.002093 446.649429
0.126773 444.43556
0.153526 441.091266
0.665141 438.630663
0.818634 438.322473
0.821935 438.123779
1.040576 437.819897
1.047678 437.615347
1.232043 437.311644
1.233891 437.110123
2.115123 432.946184
2.149979 431.735199
2.177127 431.102365
4.227669 428.296807
4.820773 428.296807

EOD
$a2 << EOD
0.001279 446.649429
0.084567 444.43556
0.119749 441.091266
0.458433 438.630663
0.560502 438.322473
0.566609 438.123779
0.731604 437.819897
0.741026 437.615347
0.883199 437.311644
0.884720 437.110123
1.691056 432.946184
1.722719 431.735199
1.750388 431.102365
3.845977 428.296807
5.025406 428.296807

EOD
$a3 << EOD
0.005321 446.649429
0.096497 434.121765
4.759980 434.121765

EOD
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
  set terminal pngcairo size 960,600 font ',11'
} else {
  set terminal png size 960,600
}
set output 'compare-nmt.png'
set title 'nmt on flexflow-p100' noenhanced
set xlabel 'search time (s)'
set ylabel 'best predicted iteration time (ms)'
set key outside right top noenhanced
set grid
plot $a0 using 1:2 with steps linewidth 2 linecolor 1 title 'mcmc', \
     $a1 using 1:2 with steps linewidth 2 linecolor 2 title 'optcnn', \
     $a2 using 1:2 with steps linewidth 2 linecolor 3 title 'dp', \
     $a3 using 1:2 with steps linewidth 2 linecolor 4 title 'beam', \
     446.649429 with lines dashtype 2 linecolor 'gray' title 'data parallel'
